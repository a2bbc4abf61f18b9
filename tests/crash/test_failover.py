"""A Postgres failover under load: a primary and a streaming standby built from the local
binaries (ledgerloop.testing.replication), two `ledgerloop up` workers on a multi-host URL,
runs filing tickets in flight; the primary is stopped at once and the standby promoted.

- Synchronous replication: nothing committed is lost. Every run ends, no model turn is asked
  twice, no key is delivered twice.
- Asynchronous replication with the standby cut off a moment before the failover: the
  commits of that moment are lost (the database goes back in time). Every run still ends,
  no key creates two tickets, and every ticket the downstream created has its ledger row on
  the new primary, succeeded.

Each test prints the time from the promotion to the first step recorded on the new primary
and to the last run's end (docs/operations.md, Failover, quotes them).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from ledgerloop.db.migrate import upgrade
from ledgerloop.db.url import validate_url
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, start_worker, stop_all, worker_env
from ledgerloop.testing.replication import ReplicatedPair, replicated_pair
from tests.conftest import start_test_run

pytestmark = pytest.mark.crash

RUNS = 30

#: One ticket per run (half through the idempotent endpoint, half through the one that is
#: asked what a key created), then a final answer; each answer a little slow, so runs are in
#: every part of a turn when the primary goes.
SCRIPT = """
conversations:
  - match: "idem"
    turns:
      - {tool_use: {name: ticket_idempotent, input: {title: failover}}, delay_ms: 400}
      - {text: done, delay_ms: 400}
  - match: "look"
    turns:
      - {tool_use: {name: ticket_lookup, input: {title: failover}}, delay_ms: 400}
      - {text: done, delay_ms: 400}
default:
  turns:
    - {text: unexpected}
"""


@pytest.fixture
def tickets() -> Iterator[TicketServiceThread]:
    with TicketServiceThread() as service:
        yield service


def _database(pair: ReplicatedPair) -> str:
    with psycopg.connect(pair.primary.url, autocommit=True) as admin:
        admin.execute("CREATE DATABASE ledgerloop")
    url = pair.multi_host_url("ledgerloop")
    upgrade(validate_url(url))  # as `ledgerloop db upgrade` does
    pair.wait_caught_up()
    return url


def _env(url: str, model_url: str, tickets: TicketServiceThread) -> dict[str, str]:
    return worker_env(
        url,
        ANTHROPIC_BASE_URL=model_url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
        LEDGERLOOP_EFFECT_SETTLE_AFTER_S="0.5",
        LEDGERLOOP_RECONCILE_INTERVAL_S="0.5",
        LEDGERLOOP_RELAY_LEASE_MARGIN_S="1",
    )


def _registered(url: str) -> int:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute("SELECT count(*) AS n FROM ledgerloop.executor").fetchone()
    return int(row["n"]) if row else 0


def _statuses(url: str, run_ids: list[uuid.UUID]) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT id::text, status FROM ledgerloop.agent_run WHERE id = ANY(%s)",
            ([str(r) for r in run_ids],),
        ).fetchall()
    return {r["id"]: r["status"] for r in rows}


def _all_ended(url: str, run_ids: list[uuid.UUID]) -> bool:
    try:
        statuses = _statuses(url, run_ids)
    except psycopg.OperationalError:
        return False
    terminal = {s.value for s in TERMINAL}
    return len(statuses) == len(run_ids) and all(s in terminal for s in statuses.values())


def _figures(url: str, run_ids: list[uuid.UUID], promoted_wall: float) -> tuple[float, float]:
    """Seconds from the promotion to the first step recorded after it, and to the last
    run's end."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        first = conn.execute(
            "SELECT min(completed_at_epoch_ms) AS ms FROM dbos.operation_outputs "
            "WHERE completed_at_epoch_ms > %s",
            (int(promoted_wall * 1000),),
        ).fetchone()
        last = conn.execute(
            "SELECT extract(epoch FROM max(updated_at))::float8 AS at FROM ledgerloop.agent_run "
            "WHERE id = ANY(%s)",
            ([str(r) for r in run_ids],),
        ).fetchone()
    assert first is not None
    assert first["ms"] is not None, "no step recorded after the promotion"
    assert last is not None
    return first["ms"] / 1000 - promoted_wall, float(last["at"]) - promoted_wall


def _effects(url: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT idempotency_key, status FROM ledgerloop.activity_effect"
        ).fetchall()
    return {r["idempotency_key"]: r["status"] for r in rows}


def _story(url: str, keys: dict[str, str | None]) -> str:
    """What the new primary holds of the runs of `keys` (a failure's message)."""
    lines = []
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        for key, status in keys.items():
            run_id = key.split(":")[0]
            run = conn.execute(
                "SELECT status FROM ledgerloop.agent_run WHERE id = %s", (run_id,)
            ).fetchone()
            steps = conn.execute(
                "SELECT function_id, function_name FROM dbos.operation_outputs "
                "WHERE workflow_uuid = %s ORDER BY function_id",
                (run_id,),
            ).fetchall()
            effects = conn.execute(
                "SELECT idempotency_key, status FROM ledgerloop.activity_effect WHERE run_id = %s",
                (run_id,),
            ).fetchall()
            rewound = conn.execute(
                "SELECT 1 FROM ledgerloop.run_rewound WHERE run_id = %s", (run_id,)
            ).fetchone()
            lines.append(
                f"{key}: effect {status}; run {run and run['status']}; rewound {bool(rewound)}; "
                f"steps {[(r['function_id'], r['function_name']) for r in steps]}; "
                f"effects {[(r['idempotency_key'], r['status']) for r in effects]}"
            )
    return "\n".join(lines)


def _turns_asked(model: Any) -> Counter[tuple[str, int]]:
    """How often each (conversation's first user message, turn) was asked."""
    asked: Counter[tuple[str, int]] = Counter()
    for record in model.requests():
        request = record.get("request") or {}
        messages = request.get("messages") or []
        first = json.dumps(messages[0]["content"]) if messages else ""
        asked[(first, int(record.get("turn") or 0))] += 1
    return asked


def _under_load(
    pair: ReplicatedPair,
    model: Any,
    tickets: TicketServiceThread,
    tmp_path: Path,
    *,
    lose_commits: bool,
) -> tuple[list[uuid.UUID], float, str]:
    url = _database(pair)
    env = _env(url, model.url, tickets)
    workers = [start_worker(env, log=tmp_path / f"worker-{i}.log") for i in range(2)]
    try:
        # Both registered before any run starts: on a loaded machine a worker's start-up
        # (imports, DBOS's launch) takes tens of seconds, which is not what is measured here.
        wait_until(lambda: _registered(url) >= 2, timeout=180, interval=0.1)
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            run_ids = [
                start_test_run(conn, "writer", f"{'idem' if i % 2 else 'look'} failover {i}")
                for i in range(RUNS)
            ]
        # Mid-flight: some tickets delivered, none of the runs ended yet.
        wait_until(
            lambda: len(tickets.app.state.store.all()) >= RUNS // 6, timeout=120, interval=0.01
        )
        if lose_commits:
            pair.cut_replication()
            time.sleep(0.6)  # the primary commits on; the standby never sees it
        pair.fail_over()
        promoted_wall = time.time()
        try:
            wait_until(lambda: _all_ended(url, run_ids), timeout=120, interval=0.1)
        except AssertionError:
            logs = "\n".join(
                f"== {p.name}\n{p.read_text()[-6000:]}" for p in tmp_path.glob("worker-*.log")
            )
            raise AssertionError(f"runs not ended: {_statuses(url, run_ids)}\n{logs}") from None
        return run_ids, promoted_wall, url
    finally:
        stop_all(*workers)


@pytest.mark.timeout(300)
def test_a_synchronous_failover_loses_nothing_and_repeats_nothing(
    scripted_model: Any, tickets: TicketServiceThread, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    with replicated_pair(synchronous=True) as pair:
        run_ids, promoted_wall, url = _under_load(
            pair, model, tickets, tmp_path, lose_commits=False
        )
        to_first, to_last = _figures(url, run_ids, promoted_wall)
        print(f"\nsynchronous: first step {to_first:.2f} s, last run end {to_last:.2f} s")
        statuses = _statuses(url, run_ids)
        assert set(statuses.values()) == {RunStatus.SUCCEEDED.value}, statuses
        asked = _turns_asked(model)
        assert len(asked) == 2 * RUNS
        assert [k for k, n in asked.items() if n > 1] == []
        created = Counter(t.idempotency_key for t in tickets.app.state.store.all())
        assert len(created) == RUNS
        assert [k for k, n in created.items() if n > 1] == []
        effects = _effects(url)
        assert {effects.get(k) for k in created} == {"succeeded"}


# Under three busy loops on 2 cores it passed 3 times in 5 after the fixes of issue 42's
# follow-up (connections on a new timeline wait for the rewind check, a second check after the
# claim grace, woken waits, no delivery of an old-timeline claim); before them, 2 in 3. What
# is left: a step body that wrote to the old primary in its last moment (a run's end, say) and
# whose checkpoint, retried, landed on the new one: the rewind check sees that checkpoint and
# nothing missing, the workflow ends, the run's end is lost and the sweeper settles it
# `failed` (workflow_ended). Refusing such a checkpoint after every timeline change broke the
# synchronous promise (a step re-run asks its model again); doing so only when commits were
# lost is not finished.
@pytest.mark.xfail(
    reason="a step's write on the old primary can be lost under its checkpoint on the new one",
    strict=False,
)
@pytest.mark.timeout(300)
def test_an_asynchronous_failover_that_loses_commits_is_followed(
    scripted_model: Any, tickets: TicketServiceThread, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    with replicated_pair(synchronous=False) as pair:
        run_ids, promoted_wall, url = _under_load(pair, model, tickets, tmp_path, lose_commits=True)
        to_first, to_last = _figures(url, run_ids, promoted_wall)
        print(f"\nasynchronous: first step {to_first:.2f} s, last run end {to_last:.2f} s")
        statuses = _statuses(url, run_ids)
        assert set(statuses.values()) == {RunStatus.SUCCEEDED.value}, statuses
        created = Counter(t.idempotency_key for t in tickets.app.state.store.all())
        assert len(created) == RUNS
        assert [k for k, n in created.items() if n > 1] == []
        effects = _effects(url)
        missing = {k: effects.get(k) for k in created if effects.get(k) != "succeeded"}
        assert missing == {}, f"tickets without a succeeded ledger row: {_story(url, missing)}"
