"""An execution whose run a peer took over ends: it is not left polling for the peer's outcome.

A real in-process worker, its run waiting for an approval. The database then says what a
peer's takeover leaves (another owner holds the workflow) and the worker's fence is revoked,
as its heartbeat does on learning of the takeover. The approval wakes the execution; its next
step finds the run is not its own, records nothing, and the execution's task ends. The
worker then stops cleanly, with nothing left running that its shutdown could break.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.fleet import dbos_internals
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.worker import WorkerThread
from tests.conftest import journal_steps, start_test_run

SCRIPT = """
default:
  turns:
    - tool_use: {name: write_ticket, input: {title: "db-1 disk full", priority: high}}
    - text: "Filed."
"""


def _steps(conn: Conn, run_id: uuid.UUID) -> list[str]:
    # DBOS's own records of the wait (its timeout, the message) are left out.
    return [name for name in journal_steps(conn, run_id) if not name.startswith("DBOS.")]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def dbos_log() -> Iterator[_Records]:
    """What DBOS logs at WARNING and above (its logger does not propagate to the root)."""
    handler = _Records()
    logger = logging.getLogger("dbos")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_an_execution_that_lost_its_run_ends_and_the_worker_stops_cleanly(
    conn: Conn, scripted_model: Any, worker: Any, dbos_log: _Records
) -> None:
    model = scripted_model(SCRIPT)
    thread: WorkerThread = worker(model.url, hibernate_after_s=0)
    runtime = thread.runtime
    assert runtime is not None
    assert runtime.fence is not None
    fence = runtime.fence
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    run_id = start_test_run(conn, "ops", "db-1 disk is full")
    wait_until(lambda: approval_list(conn, run_id=run_id, status="pending"), timeout=30)
    (approval,) = approval_list(conn, run_id=run_id, status="pending")
    (execution,) = fence.executions
    # The approval row commits inside the approve step, a moment before DBOS records it:
    # wait for that record, so the run is in its wait.
    wait_until(lambda: _steps(conn, run_id)[-1].startswith("approve-0-"), timeout=30)
    before = _steps(conn, run_id)

    # What a peer's takeover and its own claim leave behind, then what this worker's
    # heartbeat does when it finds its row gone.
    conn.execute(
        "UPDATE dbos.workflow_status SET owner_xid = 'a-peer', executor_id = 'peer'"
        " WHERE workflow_uuid = %s",
        (str(run_id),),
    )
    fence.revoke()
    approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")

    # The execution stopped at its fence and its task ended: nothing of it is still running
    # here (DBOS would otherwise keep it, polling for the peer's outcome).
    wait_until(execution.done, timeout=20)
    assert execution.cancelled()
    assert not fence.executions
    assert dbos_internals.running_on_queue("ledgerloop_runs") == 0
    # It recorded nothing after the wait, and the peer's claim stands.
    assert _steps(conn, run_id) == before
    row = conn.execute(
        "SELECT status, owner_xid FROM dbos.workflow_status WHERE workflow_uuid = %s",
        (str(run_id),),
    ).fetchone()
    assert row == {"status": "PENDING", "owner_xid": "a-peer"}
    assert len(model.requests()) == 1

    thread.stop()
    errors = [r.getMessage() for r in dbos_log.records if r.levelno >= logging.ERROR]
    assert errors == []
