"""The relay against the real ticket service: each answer class, retries, messages, wake-up."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest

from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.effects.hashing import request_hash
from ledgerloop.effects.ledger import Effect, compensation_begin, effect_begin, effect_get
from ledgerloop.effects.messages import EffectStatus, OutboxStatus
from ledgerloop.effects.outbox import Outcome, connect_async, outbox_claim, outbox_record
from ledgerloop.effects.relay import RelayConfig
from ledgerloop.effects.testing import (
    RelayThread,
    act_event,
    drain_outbox,
    messages_for,
    workflow_row,
)
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.store import run_create
from ledgerloop.testing.postgres import wait_until
from ledgerloop.version import __version__

BODY = {"title": "Printer on fire", "body": "third floor", "priority": "high"}
# Fast backoff so retry tests take milliseconds; the ticket service's refusals also carry
# Retry-After: 0.
FAST = RelayConfig(backoff_base_s=0.01, settle_after_s=0)


@pytest.fixture(params=["lean", "httpx"])
def fast(request: pytest.FixtureRequest) -> RelayConfig:
    """FAST, over each HTTP transport: the answers must be classified the same by both."""
    return RelayConfig(backoff_base_s=0.01, settle_after_s=0, transport=request.param)


@pytest.fixture(scope="module")
def service() -> Iterator[TicketServiceThread]:
    with TicketServiceThread() as svc:
        yield svc


@pytest.fixture
def tickets(service: TicketServiceThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, timeout=5) as client:
        assert client.post("/_reset").status_code == 200
        yield client


@pytest.fixture
def destinations(service: TicketServiceThread) -> dict[str, str]:
    return {"tickets": service.url}


def kind_request(kind: str, **overrides: Any) -> dict[str, Any]:
    """How each ticket-service kind is described to the relay."""
    request: dict[str, Any] = {"path": f"/{kind}/tickets", "body": BODY}
    if kind == "idempotent":
        request |= {"honours_idempotency": True, "lookup_path": "/idempotent/tickets/by-key/{key}"}
    if kind == "lookup":
        request |= {"lookup_path": "/lookup/tickets/by-key/{key}"}
    return request | overrides


def begin(
    conn: Conn, kind: str = "idempotent", destination: str = "tickets", **overrides: Any
) -> Effect:
    run_id = run_create(conn, agent="ops", input={})[0].id
    workflow_row(conn, run_id)
    act_event(conn, run_id, f"{run_id}:call-1")
    request = kind_request(kind, **overrides)
    return effect_begin(
        conn,
        key=f"{run_id}:call-1",
        run_id=run_id,
        tenant_id=DEFAULT_TENANT,
        tool="write_ticket",
        request_hash=request_hash("write_ticket", request, destination, "v1"),
        destination=destination,
        request=request,
    )


def arm(tickets: httpx.Client, **fault: Any) -> None:
    assert tickets.post("/_faults", json=fault).status_code == 201


def stats(tickets: httpx.Client) -> dict[str, Any]:
    data: dict[str, Any] = tickets.get("/_stats").json()
    return data


def outbox(conn: Conn, key: str) -> dict[str, Any]:
    row = conn.execute(
        "SELECT * FROM ledgerloop.outbox WHERE idempotency_key = %s", (key,)
    ).fetchone()
    assert row is not None
    return row


def settled(conn: Conn, effect: Effect) -> Effect:
    found = effect_get(conn, effect.key)
    assert found is not None
    return found


def statuses(conn: Conn, effect: Effect) -> list[str]:
    return [m["message"]["status"] for m in messages_for(conn, effect.run_id, effect.key)]


@pytest.mark.parametrize("kind", ["idempotent", "lookup", "plain"])
def test_delivers_once_and_tells_the_workflow(
    fast: RelayConfig,
    conn: Conn,
    db_url: str,
    tickets: httpx.Client,
    destinations: dict[str, str],
    kind: str,
) -> None:
    effect = begin(conn, kind)

    assert drain_outbox(db_url, destinations, fast) == 1

    done = settled(conn, effect)
    assert done.status == EffectStatus.SUCCEEDED
    assert done.attempts == 1
    assert done.external_reference == "TCK-000001"
    assert done.result["idempotency_key"] == effect.key  # the header carried the key
    assert outbox(conn, effect.key)["status"] == OutboxStatus.DONE
    assert stats(tickets)["created"] == 1
    [sent] = messages_for(conn, effect.run_id)
    assert sent["topic"] == effect.key
    assert sent["message"] == {
        "key": effect.key,
        "status": "succeeded",
        "result": done.result,
        "error": None,
        "external_reference": "TCK-000001",
    }
    # Nothing is left to send: a second relay pass creates nothing.
    assert drain_outbox(db_url, destinations, fast) == 0
    assert stats(tickets)["created"] == 1


def test_refusals_are_retried_until_success(
    fast: RelayConfig, conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    arm(tickets, mode="rate_limit")
    arm(tickets, mode="fail_before_commit")
    effect = begin(conn, "plain", max_attempts=3)

    drain_outbox(db_url, destinations, fast)

    done = settled(conn, effect)
    assert (done.status, done.attempts) == (EffectStatus.SUCCEEDED, 3)
    assert stats(tickets) == {
        "created": 1,
        "by_kind": {"idempotent": 0, "lookup": 0, "plain": 1},
        "requests": 3,
        "closed": 0,
    }
    assert statuses(conn, effect) == ["succeeded"]  # retries are not reported


def test_refusals_past_max_attempts_fail_with_the_reason(
    fast: RelayConfig, conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    arm(tickets, mode="fail_before_commit", count=5)
    effect = begin(conn, "idempotent", max_attempts=2)

    drain_outbox(db_url, destinations, fast)

    done = settled(conn, effect)
    assert done.status == EffectStatus.FAILED
    assert done.error is not None
    assert "gave up after 2 attempts" in done.error
    assert "HTTP 503" in done.error
    assert outbox(conn, effect.key)["status"] == OutboxStatus.DEAD
    assert stats(tickets)["created"] == 0
    assert statuses(conn, effect) == ["failed"]


def test_a_retry_that_would_pass_the_deadline_fails_instead(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    arm(tickets, mode="rate_limit")
    effect = begin(conn, "idempotent", deadline_s=0.001, max_attempts=10)

    drain_outbox(db_url, destinations, FAST)

    done = settled(conn, effect)
    assert done.status == EffectStatus.FAILED
    assert "deadline of 0.001s" in (done.error or "")
    assert done.attempts == 1


def test_connection_refused_is_retried_then_fails(
    conn: Conn, db_url: str, fast: RelayConfig
) -> None:
    with TicketServiceThread() as gone:
        closed_url = gone.url  # a port nothing listens on any more
    effect = begin(conn, "idempotent", max_attempts=2)

    drain_outbox(db_url, {"tickets": closed_url}, fast)

    done = settled(conn, effect)
    assert (done.status, done.attempts) == (EffectStatus.FAILED, 2)
    assert "ConnectError" in (done.error or "")


def test_a_client_error_fails_without_retrying(
    fast: RelayConfig, conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effect = begin(conn, "idempotent", body={"title": "", "priority": "urgent"})

    drain_outbox(db_url, destinations, fast)

    done = settled(conn, effect)
    assert (done.status, done.attempts) == (EffectStatus.FAILED, 1)
    assert done.error is not None
    assert "HTTP 422" in done.error
    assert "priority" in done.error  # an excerpt of the body says why
    assert outbox(conn, effect.key)["status"] == OutboxStatus.DONE
    assert stats(tickets)["requests"] == 0  # refused by validation, never counted
    [sent] = messages_for(conn, effect.run_id)
    assert sent["message"]["status"] == "failed"
    assert sent["message"]["error"] == done.error


@pytest.mark.parametrize(
    ("fault", "timeout_ms", "expected"),
    [
        ({"mode": "commit_then_drop"}, 5000, "RemoteProtocolError"),
        ({"mode": "garbage"}, 5000, "not JSON"),
        ({"mode": "slow", "delay_ms": 400}, 100, "no answer from"),
    ],
)
def test_an_answer_lost_after_the_commit_is_unknown_never_success(
    fast: RelayConfig,
    conn: Conn,
    db_url: str,
    tickets: httpx.Client,
    destinations: dict[str, str],
    fault: dict[str, Any],
    timeout_ms: int,
    expected: str,
) -> None:
    arm(tickets, **fault)
    effect = begin(conn, "plain", timeout_ms=timeout_ms)

    drain_outbox(db_url, destinations, fast)

    done = settled(conn, effect)
    assert done.status == EffectStatus.OUTCOME_UNKNOWN
    assert done.external_reference is None
    assert expected in (done.error or "")
    assert done.evidence is not None
    assert done.evidence["attempts"] == 1
    assert done.lease_until is not None  # when the reconciler may look
    assert stats(tickets)["created"] == 1  # the ticket does exist
    assert statuses(conn, effect) == ["outcome_unknown"]


def test_unknown_destination_fails_naming_the_known_ones(
    conn: Conn, db_url: str, destinations: dict[str, str]
) -> None:
    effect = begin(conn, "idempotent", destination="billing")

    drain_outbox(db_url, destinations, FAST)

    done = settled(conn, effect)
    assert done.status == EffectStatus.FAILED
    assert done.error == (
        "unknown destination 'billing'; this relay knows: tickets "
        "(destinations: in the policy file, or LEDGERLOOP_DESTINATIONS)"
    )
    assert outbox(conn, effect.key)["status"] == OutboxStatus.DEAD
    assert statuses(conn, effect) == ["failed"]


def test_a_failed_compensation_waits_for_a_person(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    original = begin(conn, "idempotent")
    drain_outbox(db_url, destinations, FAST)
    done = settled(conn, original)
    # The ticket service cannot delete tickets: the undo is refused (405).
    undo = compensation_begin(
        conn, done, {"path": f"/tickets/{done.external_reference}", "method": "DELETE"}
    )

    drain_outbox(db_url, destinations, FAST)

    parked = settled(conn, undo)
    assert parked.status == EffectStatus.NEEDS_HUMAN
    assert (parked.error or "").startswith("compensation failed: HTTP 405")
    assert parked.evidence is not None
    assert parked.evidence["request"]["method"] == "DELETE"
    assert statuses(conn, undo) == ["needs_human"]
    assert settled(conn, original).status == EffectStatus.SUCCEEDED


def test_a_repeated_outcome_is_a_no_op(
    conn: Conn, db_url: str, destinations: dict[str, str]
) -> None:
    """Recording one attempt's outcome twice changes nothing and sends nothing twice."""
    effect = begin(conn, "idempotent")

    async def claim_and_record_twice() -> tuple[set[str], set[str]]:
        db = await connect_async(db_url)
        async with db:
            [claimed] = await outbox_claim(db, limit=10, lease_margin_s=5)
            outcome = Outcome(
                claimed,
                EffectStatus.SUCCEEDED,
                OutboxStatus.DONE,
                external_reference="T-1",
                result={"id": "T-1"},
            )
            first = await outbox_record(db, [outcome])
            late = Outcome(claimed, EffectStatus.FAILED, OutboxStatus.DONE, error="late")
            second = await outbox_record(db, [outcome, late])
            return first, second

    first, second = asyncio.run(claim_and_record_twice())

    assert first == {effect.key}
    assert second == set()
    done = settled(conn, effect)
    assert (done.status, done.external_reference, done.error) == (
        EffectStatus.SUCCEEDED,
        "T-1",
        None,
    )
    assert statuses(conn, effect) == ["succeeded"]


def test_a_notification_wakes_the_idle_relay(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    # A long safety poll: only the notification can explain a fast delivery.
    config = RelayConfig(safety_poll_s=30)
    with RelayThread(db_url, destinations, config) as relay:
        wait_until(relay.ready, timeout=10)
        latencies = []
        for _ in range(5):
            start = time.monotonic()
            effect = begin(conn, "idempotent")
            wait_until(
                lambda e=effect: settled(conn, e).status == EffectStatus.SUCCEEDED,  # type: ignore[misc]
                timeout=5,
                interval=0.002,
            )
            latencies.append(time.monotonic() - start)
            wait_until(relay.ready, timeout=5)
    assert max(latencies) < 1.0, latencies
    assert stats(tickets)["created"] == 5


def test_a_relay_started_late_delivers_what_was_waiting(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effects = [begin(conn, "lookup") for _ in range(3)]
    with RelayThread(db_url, destinations, RelayConfig(safety_poll_s=30)):
        wait_until(
            lambda: all(settled(conn, e).status == EffectStatus.SUCCEEDED for e in effects),
            timeout=5,
        )
    assert stats(tickets)["created"] == 3


def test_many_effects_deliver_concurrently_each_once(
    conn: Conn, db_url: str, tickets: httpx.Client, destinations: dict[str, str]
) -> None:
    effects = [begin(conn, "plain") for _ in range(60)]

    recorded = drain_outbox(db_url, destinations, RelayConfig(concurrency=16, batch_size=16))

    assert recorded == 60
    assert stats(tickets)["created"] == 60
    refs = {settled(conn, e).external_reference for e in effects}
    assert len(refs) == 60


class _CookieSetter(BaseHTTPRequestHandler):
    """A destination that answers every POST with a session cookie, and remembers the
    Cookie header each request brought."""

    seen: ClassVar[list[str | None]] = []
    agents: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append(self.headers.get("Cookie"))
        type(self).agents.append(self.headers.get("User-Agent"))
        body = json.dumps({"id": f"t-{len(type(self).seen)}"}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "session=first-callers-session; Path=/")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_destinations_cookie_never_goes_out_with_another_delivery(
    conn: Conn, db_url: str, fast: RelayConfig
) -> None:
    """The relay's one HTTP client serves every run and tenant: a cookie one delivery was
    given must not ride the next (another run's, another tenant's) to the same place."""
    _CookieSetter.seen = []
    _CookieSetter.agents = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CookieSetter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        effects = []
        # One relay for all three, one after another: its client would have kept the cookie.
        with RelayThread(db_url, {"cookies": url}, fast) as relay:
            wait_until(relay.ready, timeout=10)
            for _ in range(3):
                effect = begin(conn, "plain", destination="cookies")
                wait_until(
                    lambda e=effect: settled(conn, e).status is EffectStatus.SUCCEEDED,  # type: ignore[misc]
                    timeout=10,
                    interval=0.01,
                )
                effects.append(effect)
    finally:
        server.shutdown()
        server.server_close()
    assert len(effects) == 3
    assert _CookieSetter.seen == [None, None, None]
    # Either client says who calls.
    assert _CookieSetter.agents == [f"ledgerloop/{__version__}"] * 3
