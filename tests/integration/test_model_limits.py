"""The fleet's model limits: two workers' clients share one budget in the database, a 429
is owed by both, the scripted server enforces a limit, and a zero limit is refused.

Two model clients, each with its own pool and limiter, stand for two workers: what they
share is the database row, as separate processes do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from ledgerloop.config import load_settings
from ledgerloop.control.timeline import run_timeline
from ledgerloop.db.connect import Conn, make_pool
from ledgerloop.errors import ConfigError
from ledgerloop.models.client import ModelClient, Tier
from ledgerloop.models.limits import FleetLimiter, ModelLimits
from ledgerloop.models.script import parse_script
from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.worker import WorkerThread
from tests.conftest import start_test_run, wait_terminal
from tests.support.telemetry import Captured


def client_for(url: str, limiter: FleetLimiter | None) -> ModelClient:
    return ModelClient(
        new_client=lambda: anthropic.AsyncAnthropic(api_key="k", base_url=url, max_retries=0),
        tiers={Tier.CHEAP: "cheap-model", Tier.STRONG: "strong-model"},
        server_address="127.0.0.1",
        server_port=0,
        limiter=limiter,
    )


@pytest.fixture
def limiters(db_url: str) -> Iterator[Any]:
    pools = []

    def make(limits: ModelLimits) -> FleetLimiter:
        pool = make_pool(db_url, min_size=1, max_size=2, name="limits-test")
        pools.append(pool)
        limiter = FleetLimiter(pool, limits)
        limiter.declare()
        return limiter

    yield make
    for pool in pools:
        pool.close()


def ask(client: ModelClient, text: str) -> Any:
    return client.create(
        model="cheap-model", max_tokens=10, messages=[{"role": "user", "content": text}]
    )


def test_two_workers_share_one_request_budget(limiters: Any, scripted_model: Any) -> None:
    model = scripted_model("default:\n  turns:\n    - {text: ok}\n")
    limits = ModelLimits({"requests": 600})  # 10 a second, at most 10 at once
    clients = [client_for(model.url, limiters(limits)) for _ in range(2)]

    async def burst() -> list[Any]:
        calls = [ask(clients[i % 2], f"call {i}") for i in range(40)]
        try:
            return await asyncio.gather(*calls)
        finally:
            for client in clients:
                await client.close()

    started = time.monotonic()
    answers = asyncio.run(burst())
    elapsed = time.monotonic() - started
    # 40 calls at 10 a second with a burst of 10: the last is sent about 3 s after the first.
    assert elapsed >= 2.8
    # One bucket for both, of 10 refilled at 10 a second: the last of the 40 calls to take
    # its share is given a slot about 3 s after the first. With a budget each (20 calls
    # against 10 at once and 10 a second), no call would wait more than about 1 s.
    assert max(a.get("rate_limit_wait_s", 0.0) for a in answers) >= 1.6
    assert len(model.requests()) == 40


def refusals(conn: Conn) -> int:
    row = conn.execute("SELECT coalesce(sum(refusals), 0) AS n FROM ledgerloop.model_budget")
    found = row.fetchone()
    return int(found["n"]) if found else 0


def test_a_429_is_owed_by_the_whole_fleet(conn: Conn, limiters: Any, scripted_model: Any) -> None:
    model = scripted_model(
        "conversations:\n"
        "  - match: refused\n"
        "    turns:\n"
        "      - {status: 429, retry_after_s: 2, times: 1, then: {text: ok}}\n"
        "default:\n  turns:\n    - {text: ok}\n"
    )
    limits = ModelLimits({"requests": 6000})
    first, second = (client_for(model.url, limiters(limits)) for _ in range(2))

    async def both() -> tuple[Any, float]:
        try:
            refused = asyncio.create_task(ask(first, "refused once"))
            while not refusals(conn):  # the 429 is the fleet's (its debt recorded)
                await asyncio.sleep(0.01)
            # The other worker was never refused, and waits out the Retry-After all the same.
            started = time.monotonic()
            answer = await ask(second, "a call of its own")
            await refused
            return answer, time.monotonic() - started
        finally:
            await first.close()
            await second.close()

    answer, elapsed = asyncio.run(both())
    assert answer["rate_limit_wait_s"] >= 1.5
    assert elapsed >= 1.5
    assert [r["status"] for r in model.requests()] == [429, 200, 200]


def test_the_scripted_server_enforces_a_limit() -> None:
    script = parse_script("default:\n  turns:\n    - {text: ok}\n")
    with ScriptedModelServer(script, rpm_limit=3) as server:
        client = client_for(server.url, None)
        client = ModelClient(
            new_client=client.new_client, tiers=client.tiers, server_address="", server_port=0
        )

        async def calls() -> None:
            try:
                for i in range(3):
                    await ask(client, f"call {i}")
                one = {"role": "user", "content": "x"}
                request = {"model": "m", "max_tokens": 1, "messages": [one]}
                with pytest.raises(anthropic.RateLimitError) as refused:
                    await client._send(request, None)
                assert 55 <= int(refused.value.response.headers["retry-after"]) <= 60
            finally:
                await client.close()

        asyncio.run(calls())
    assert [r["outcome"] for r in server.requests()][-1] == "rate_limited"


@pytest.mark.parametrize("setting", ["MODEL_RPM", "MODEL_INPUT_TPM_STRONG"])
def test_a_zero_or_negative_limit_is_refused(
    setting: str, monkeypatch: pytest.MonkeyPatch, conn: Conn
) -> None:
    for value in ("0", "-5"):
        monkeypatch.setenv(f"LEDGERLOOP_{setting}", value)
        with pytest.raises(ConfigError, match=f"set LEDGERLOOP_{setting}"):
            load_settings()


def test_a_runs_wait_for_the_budget_shows_in_its_timeline_and_trace(
    conn: Conn,
    make_settings: Any,
    db_url: str,
    scripted_model: Any,
    captured: Captured,
    dbos_client: Any,
) -> None:
    model = scripted_model("default:\n  turns:\n    - {text: done}\n")
    # One call a second: of three runs started together, the last waits about 2 s.
    settings = make_settings(
        anthropic_base_url=model.url, model_rpm=60, agent_modules="tests.support.agents"
    )
    with WorkerThread(settings, db_url):
        runs = [start_test_run(conn, "ops", f"limited {i}") for i in range(3)]
        for run_id in runs:
            assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    waits = []
    for run_id in runs:
        timeline = run_timeline(conn, run_id, steps=dbos_client)
        waits += [
            e.detail["budget_wait_s"]
            for e in timeline.entries
            if e.kind == "step" and "budget_wait_s" in (e.detail or {})
        ]
    assert max(waits) >= 1.5
    events = [
        event
        for span in captured.by_kind("chat")
        for event in span.events
        if event.name == "ledgerloop.model.budget_wait"
    ]
    assert len(events) == len(waits)
    assert dict(events[0].attributes or {})["ledgerloop.budget"] == "requests"
