"""Two processes advance the same run at once: exactly one wins, the other is told why."""

from __future__ import annotations

import multiprocessing as mp
import uuid
from multiprocessing.synchronize import Barrier
from typing import Any

import pytest

from ledgerloop.db.connect import Conn, connect
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import (
    Outcome,
    StaleRun,
    run_create,
    run_events,
    run_require,
    run_transition,
)


def _advance(url: str, run_id: str, target: str, event: str, barrier: Barrier, out: Any) -> None:
    with connect(url, autocommit=True) as conn:
        snapshot = run_require(conn, uuid.UUID(run_id))
        barrier.wait(timeout=20)
        try:
            result = run_transition(conn, snapshot, RunStatus(target), event)
            out.put(result.outcome.value)
        except StaleRun as exc:
            out.put(f"stale:{exc.current.status.value}")


def _race(db_url: str, run_id: uuid.UUID, moves: list[tuple[str, str]]) -> list[str]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(moves))
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_advance, args=(db_url, str(run_id), t, e, barrier, out))
        for t, e in moves
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return sorted(out.get(timeout=5) for _ in procs)


@pytest.fixture
def planning_run(conn: Conn) -> uuid.UUID:
    run, _ = run_create(conn, agent="ops", input={})
    run_transition(conn, run, RunStatus.PLANNING, "started")
    return run.id


def test_same_event_from_two_processes_applies_once(
    db_url: str, conn: Conn, planning_run: uuid.UUID
) -> None:
    results = _race(db_url, planning_run, [("executing", "tools"), ("executing", "tools")])
    assert results == ["applied", "duplicate"]
    assert run_require(conn, planning_run).version == 2
    assert [e.event_type for e in run_events(conn, planning_run)] == [
        "received",
        "started",
        "tools",
    ]


def test_conflicting_events_from_two_processes_one_wins_one_is_stale(
    db_url: str, conn: Conn, planning_run: uuid.UUID
) -> None:
    results = _race(
        db_url,
        planning_run,
        [("executing", "tools"), ("awaiting_approval", "approval_requested")],
    )
    assert results.count(Outcome.APPLIED.value) == 1
    stale = [r for r in results if r.startswith("stale:")]
    assert len(stale) == 1
    final = run_require(conn, planning_run)
    # The loser learns where the run really is.
    assert stale[0] == f"stale:{final.status.value}"
    assert final.version == 2
