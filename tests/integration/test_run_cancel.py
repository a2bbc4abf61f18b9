"""Cancelling a run stops its DBOS workflow through DBOS's own API, after the run's cancel
commits; a cancel made inside the caller's transaction waits for that commit, and a worker's
sweep finishes it. (A requester killed between the two commits: tests/crash/test_cancel_crash.py.)
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from dbos import DBOS

from ledgerloop.approvals.store import approval_list
from ledgerloop.control.cancel import cancel_run
from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_require
from ledgerloop.testing.postgres import wait_until
from tests.conftest import start_test_run, wait_terminal

SCRIPT = """
default:
  turns:
    - tool_use: {name: write_ticket, input: {title: "db-1 disk full", priority: high}}
    - text: "Filed."
"""


def _waiting_run(conn: Conn, scripted_model: Any, worker: Any) -> uuid.UUID:
    """A run resident in the worker, waiting for its approval."""
    worker(scripted_model(SCRIPT).url, hibernate_after_s=0, cancel_sweep_s=0.2)
    run_id = start_test_run(conn, "ops", "db-1 disk is full")
    wait_until(lambda: approval_list(conn, run_id=run_id, status="pending"), timeout=20)
    return run_id


def _workflow(run_id: uuid.UUID) -> str:
    status = DBOS.get_workflow_status(str(run_id))
    assert status is not None
    return str(status.status)


def _requests(conn: Conn) -> list[uuid.UUID]:
    rows = conn.execute("SELECT run_id FROM ledgerloop.workflow_cancel_request").fetchall()
    return [r["run_id"] for r in rows]


def test_cancel_stops_the_workflow_through_dbos(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    run_id = _waiting_run(conn, scripted_model, worker)
    cancelled = cancel_run(conn, run_id, workflows=DBOS, requested_by="test")
    assert cancelled.workflow_cancelled
    assert _workflow(run_id) == "CANCELLED"
    assert _requests(conn) == []
    assert wait_terminal(conn, run_id).status is RunStatus.CANCELLED


def test_a_cancel_inside_the_callers_transaction_reaches_dbos_after_its_commit(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    run_id = _waiting_run(conn, scripted_model, worker)
    with conn.transaction():
        cancelled = cancel_run(conn, run_id, workflows=DBOS, requested_by="test")
        assert not cancelled.workflow_cancelled
        # Not before the commit: the caller may still roll the cancel back.
        assert _workflow(run_id) == "PENDING"
    wait_until(lambda: _workflow(run_id) == "CANCELLED", timeout=10)
    wait_until(lambda: _requests(conn) == [], timeout=10)
    assert run_require(conn, run_id).status is RunStatus.CANCELLED


def test_a_rolled_back_cancel_leaves_the_run_and_its_workflow_alone(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    run_id = _waiting_run(conn, scripted_model, worker)
    with conn.transaction():
        cancel_run(conn, run_id, workflows=DBOS, requested_by="test")
        raise psycopg.Rollback()
    assert run_require(conn, run_id).status is RunStatus.AWAITING_APPROVAL
    assert _requests(conn) == []
    assert _workflow(run_id) == "PENDING"
    assert [a.status.value for a in approval_list(conn, run_id=run_id)] == ["pending"]
