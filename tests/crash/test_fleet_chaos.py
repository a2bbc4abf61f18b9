"""Chaos: three workers and a relay as real processes, runs in flight; one worker is killed
(SIGKILL) and another frozen (SIGSTOP) past the staleness limit, then thawed (SIGCONT). And
on a private cluster: a worker killed, another frozen, and Postgres restarted under them.

Invariants: every run succeeds; each run's ticket is created exactly once (the ticket
service's own count, on an endpoint without idempotency); no model call is made for a step
DBOS had already recorded (the scripted model's request log against the journal); the worker
that was never stopped is never taken over; the frozen one was taken over, stopped the runs
it lost and came back as a live worker; nothing is left stuck.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from ledgerloop.db.cluster import LocalCluster
from ledgerloop.db.connect import Conn, connect
from ledgerloop.db.migrate import upgrade
from ledgerloop.db.url import with_database
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.fleet.views import runs_stuck
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, start_relay, start_worker, stop_worker, worker_env

pytestmark = pytest.mark.crash

RUNS = 45
HEARTBEAT_S = 0.3
STALE_AFTER_S = 2.4

# Four paid model calls per run (300 ms each), a read tool, a write tool through the relay.
SCRIPT = """
default:
  turns:
    - {tool_use: {name: echo, input: {text: one}}, delay_ms: 300}
    - {tool_use: {name: ticket_plain, input: {title: chaos}}, delay_ms: 300}
    - {tool_use: {name: echo, input: {text: two}}, delay_ms: 300}
    - {text: done, delay_ms: 300}
"""


@pytest.fixture
def tickets() -> Iterator[TicketServiceThread]:
    with TicketServiceThread() as service:
        yield service


def executor_rows(conn: Conn) -> dict[str, Any]:
    rows = conn.execute("SELECT id, started_at FROM ledgerloop.executor").fetchall()
    return {r["id"]: r["started_at"] for r in rows}


def pending_by_worker(conn: Conn) -> dict[str, int]:
    rows = conn.execute(
        "SELECT executor_id, count(*) AS n FROM dbos.workflow_status "
        "WHERE name = 'ledgerloop_run' AND status = 'PENDING' GROUP BY executor_id"
    ).fetchall()
    return {r["executor_id"]: r["n"] for r in rows}


def first_text(request: dict[str, Any]) -> str:
    for message in (request.get("request") or {}).get("messages", []):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def model_calls_after_recording(
    conn: Conn, requests: list[dict[str, Any]], runs: dict[str, uuid.UUID]
) -> list[tuple[str, int]]:
    """(run, turn) of every model call made after DBOS recorded that turn's think step: the
    step that asks the model (`think-{i}-settled` when `think-{i}` ended at a write that
    had to be awaited, agent.turn_tools)."""
    rows = conn.execute(
        "SELECT workflow_uuid, function_name, completed_at_epoch_ms FROM dbos.operation_outputs "
        "WHERE function_name LIKE 'think-%%'"
    ).fetchall()
    recorded = {(r["workflow_uuid"], r["function_name"]): r["completed_at_epoch_ms"] for r in rows}
    late = []
    for request in requests:
        run_id = runs.get(first_text(request))
        if run_id is None:
            continue
        think = f"think-{request['turn']}"
        done = recorded.get((str(run_id), f"{think}-settled"), recorded.get((str(run_id), think)))
        # Both clocks are this machine's; a millisecond of slack for the rounding.
        if done is not None and request["at"] * 1000 > done + 1:
            late.append((str(run_id), int(request["turn"])))
    return late


def test_a_fleet_survives_a_kill_and_a_freeze_without_repeating_a_recorded_step(
    conn: Conn, db_url: str, scripted_model: Any, tickets: TicketServiceThread, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
        LEDGERLOOP_HEARTBEAT_S=str(HEARTBEAT_S),
        LEDGERLOOP_STALE_AFTER_S=str(STALE_AFTER_S),
        LEDGERLOOP_DISPATCH_FALLBACK_S="1",
        # No worker may hold more than 20 of the 45 runs, so at least two hold some whatever
        # order they wake in (on a loaded machine one woke first and claimed all of them).
        LEDGERLOOP_WORKER_CONCURRENCY="20",
        # Small pools: four processes share a test server's connections.
        LEDGERLOOP_DBOS_POOL_SIZE="6",
        LEDGERLOOP_POOL_SIZE="4",
    )
    logs = {name: tmp_path / f"{name}.log" for name in ("w0", "w1", "w2", "relay")}
    procs: dict[str, subprocess.Popen[bytes]] = {
        "relay": start_relay(env, log=logs["relay"]),
        **{f"w{i}": start_worker(env, "--no-relay", log=logs[f"w{i}"]) for i in range(3)},
    }

    def output() -> str:
        return "\n".join(f"== {n}\n{p.read_text()[-4000:]}" for n, p in logs.items() if p.exists())

    frozen: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: len(executor_rows(conn)) == 3, timeout=60)
        started = executor_rows(conn)
        runs: dict[str, uuid.UUID] = {}
        with conn.transaction():
            for i in range(RUNS):
                text = f"chaos {i}"
                row = conn.execute(
                    "SELECT ledgerloop.start_run('writer', %s::jsonb) AS id",
                    (json.dumps({"message": text}),),
                ).fetchone()
                assert row is not None
                runs[text] = row["id"]
        # Every run under way, and two workers executing some: one to kill, one to freeze
        # (the third must be left alone whether it holds runs or not).
        wait_until(lambda: len({first_text(r) for r in model.requests()}) == RUNS, timeout=60)
        wait_until(lambda: len(pending_by_worker(conn)) >= 2, timeout=30)

        # The worker holding the most runs dies; another freezes past the staleness limit.
        by_worker = sorted(pending_by_worker(conn).items(), key=lambda kv: -kv[1])
        killed_id, frozen_id = by_worker[0][0], by_worker[1][0]
        live_id = next(w for w in started if w not in (killed_id, frozen_id))
        killed_name = _name_of(procs, conn, killed_id)
        frozen_name = _name_of(procs, conn, frozen_id)
        killed, frozen = procs[killed_name], procs[frozen_name]
        killed.send_signal(signal.SIGKILL)
        frozen.send_signal(signal.SIGSTOP)
        # Thawed only once a peer has taken it over (its row gone): it must find that out
        # itself, stop the executions of the runs it lost and come back.
        wait_until(lambda: frozen_id not in executor_rows(conn), timeout=30)
        frozen.send_signal(signal.SIGCONT)
        frozen = None

        def all_succeeded() -> bool:
            row = conn.execute(
                "SELECT count(*) AS n FROM ledgerloop.agent_run WHERE status = 'succeeded'"
            ).fetchone()
            return bool(row and row["n"] == RUNS)

        wait_until(all_succeeded, timeout=90, interval=0.2)
        # The thawed worker registered again (a new row under its id) and is heartbeating.
        wait_until(lambda: frozen_id in executor_rows(conn), timeout=30)
        requests = model.requests()
        after = executor_rows(conn)
        created = httpx.get(f"{tickets.url}/_stats").json()["created"]
        stuck = runs_stuck(conn, stale_after_s=STALE_AFTER_S)
    except BaseException:
        print(output())
        raise
    finally:
        if frozen is not None:
            frozen.send_signal(signal.SIGCONT)
        for proc in procs.values():
            stop_worker(proc)
    context = output()
    assert model_calls_after_recording(conn, requests, runs) == [], context
    assert created == RUNS, context  # exactly one ticket per run
    assert after[live_id] == started[live_id], context  # never taken over
    assert killed_id not in after
    assert after[frozen_id] != started[frozen_id], context  # taken over, registered again
    frozen_log = logs[frozen_name].read_text()
    assert "was taken over by a peer" in frozen_log, context
    # Its executions of the runs it lost ran no step again (model_calls_after_recording and
    # the ticket count above). Where one was between steps or inside one at the freeze, the
    # fence or DBOS's own check stopped it and said so; one waiting for a message when
    # frozen (a write's outcome) has no step to stop at, so no line is required.
    assert stuck == []
    for name in ("w0", "w1", "w2"):
        assert "Traceback" not in logs[name].read_text(), context


def _name_of(procs: dict[str, subprocess.Popen[bytes]], conn: Conn, executor_id: str) -> str:
    row = conn.execute(
        "SELECT pid FROM ledgerloop.executor WHERE id = %s", (executor_id,)
    ).fetchone()
    assert row is not None
    return next(name for name, proc in procs.items() if proc.pid == row["pid"])


# Long enough that a restart of the server fits in one streak gap (half of it): survivors
# keep judging right after the restart, the case where a free lock must not count.
RESTART_STALE_AFTER_S = 5.0
RESTART_RUNS = 30
#: How long the frozen worker stays frozen once the server is back: past its lease, so a
#: survivor would judge it dead by its free lock, and well under the staleness limit.
FREEZE_AFTER_RESTART_S = 2.0


def judges(conn: Conn, stale_after_s: float) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM ledgerloop.executor "
        "WHERE streak_started_at <= now() - make_interval(secs => %s)",
        (stale_after_s + 0.5,),
    ).fetchone()
    return int(row["n"]) if row else 0


@pytest.mark.timeout(240)
def test_a_postgres_restart_under_a_fleet_declares_no_live_worker_dead(
    cluster: LocalCluster, scripted_model: Any, tickets: TicketServiceThread, tmp_path: Path
) -> None:
    # Every session, and so every worker's advisory lock, ends with the restart: a lock found
    # free afterwards is no evidence that its worker died. One worker is killed just before
    # (it must still be taken over, after stale_after_s), one frozen across the restart (it
    # comes back within the limit and must not be declared dead), one left alone.
    with psycopg.connect(cluster.url, autocommit=True) as admin:
        admin.execute("CREATE DATABASE ledgerloop")
    db_url = with_database(cluster.url, "ledgerloop")
    upgrade(db_url)
    model = scripted_model(SCRIPT)
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
        LEDGERLOOP_HEARTBEAT_S=str(HEARTBEAT_S),
        LEDGERLOOP_STALE_AFTER_S=str(RESTART_STALE_AFTER_S),
        LEDGERLOOP_DISPATCH_FALLBACK_S="1",
        LEDGERLOOP_DISPATCH_BATCH="3",  # small batches: every worker gets some of the burst
        # ... and at most 12 of the 30 runs each, so all three hold some however they wake.
        LEDGERLOOP_WORKER_CONCURRENCY="12",
        LEDGERLOOP_DBOS_POOL_SIZE="6",
        LEDGERLOOP_POOL_SIZE="4",
    )
    logs = {name: tmp_path / f"{name}.log" for name in ("w0", "w1", "w2", "relay")}
    procs: dict[str, subprocess.Popen[bytes]] = {
        "relay": start_relay(env, log=logs["relay"]),
        **{f"w{i}": start_worker(env, "--no-relay", log=logs[f"w{i}"]) for i in range(3)},
    }

    def output() -> str:
        return "\n".join(f"== {n}\n{p.read_text()[-4000:]}" for n, p in logs.items() if p.exists())

    frozen: subprocess.Popen[bytes] | None = None
    conn = connect(db_url, autocommit=True)
    try:
        wait_until(lambda: len(executor_rows(conn)) == 3, timeout=60)
        # Every worker may judge its peers (an unbroken streak of stale_after_s) before the
        # restart, as in a fleet that has been up a while.
        wait_until(lambda: judges(conn, RESTART_STALE_AFTER_S) == 3, timeout=60)
        started = executor_rows(conn)
        runs: dict[str, uuid.UUID] = {}
        with conn.transaction():
            for i in range(RESTART_RUNS):
                text = f"restart {i}"
                row = conn.execute(
                    "SELECT ledgerloop.start_run('writer', %s::jsonb) AS id",
                    (json.dumps({"message": text}),),
                ).fetchone()
                assert row is not None
                runs[text] = row["id"]
        wait_until(
            lambda: len({first_text(r) for r in model.requests()}) == RESTART_RUNS, timeout=60
        )
        wait_until(lambda: len(pending_by_worker(conn)) == 3, timeout=30)
        by_worker = sorted(pending_by_worker(conn).items(), key=lambda kv: -kv[1])
        killed_id, frozen_id = by_worker[0][0], by_worker[1][0]
        live_id = next(w for w in started if w not in (killed_id, frozen_id))
        killed = procs[_name_of(procs, conn, killed_id)]
        frozen = procs[_name_of(procs, conn, frozen_id)]
        conn.close()
        killed.send_signal(signal.SIGKILL)
        frozen.send_signal(signal.SIGSTOP)
        cluster.stop(mode="fast")  # every session, and every advisory lock, ends here
        cluster.start()
        time.sleep(FREEZE_AFTER_RESTART_S)  # the freeze itself, not a wait for a condition
        frozen.send_signal(signal.SIGCONT)
        frozen = None
        conn = connect(db_url, autocommit=True)

        def all_succeeded() -> bool:
            row = conn.execute(
                "SELECT count(*) AS n FROM ledgerloop.agent_run WHERE status = 'succeeded'"
            ).fetchone()
            return bool(row and row["n"] == RESTART_RUNS)

        wait_until(all_succeeded, timeout=120, interval=0.2)
        requests = model.requests()
        after = executor_rows(conn)
        created = httpx.get(f"{tickets.url}/_stats").json()["created"]
        stuck = runs_stuck(conn, stale_after_s=RESTART_STALE_AFTER_S)
        late = model_calls_after_recording(conn, requests, runs)
    except BaseException:
        print(output())
        raise
    finally:
        if frozen is not None:
            frozen.send_signal(signal.SIGCONT)
        for proc in procs.values():
            stop_worker(proc)
        conn.close()
    context = output()
    assert late == [], context
    assert created == RESTART_RUNS, context  # exactly one ticket per run
    # Neither live worker was declared dead: same rows as before, nobody told it was taken over.
    assert after[live_id] == started[live_id], context
    assert after[frozen_id] == started[frozen_id], context
    for name in ("w0", "w1", "w2"):
        assert "was taken over by a peer" not in logs[name].read_text(), context
    assert killed_id not in after, context  # the dead one was, after stale_after_s
    assert stuck == [], context
