"""Hibernated runs outlive their worker: SIGKILL a worker whose runs hibernated, or one killed
between dropping a run's execution and parking it, and a fresh worker finishes them.

A parked run belongs to no process (its DBOS workflow is DELAYED), so any worker takes it when
the approval wakes it. A run whose execution ended but was never parked is still PENDING under
the dead executor: heartbeat recovery re-enqueues it, it waits (and hibernates) again.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import worker_env, worker_process
from tests.conftest import start_test_run, wait_terminal

pytestmark = pytest.mark.crash

SCRIPT = """
default:
  turns:
    - tool_use: {name: write_ticket, input: {title: "db-1 disk full", priority: high}}
    - text: "Filed."
"""


def _workflow_status(conn: Conn, run_id: uuid.UUID) -> str:
    row = conn.execute(
        "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s", (str(run_id),)
    ).fetchone()
    assert row is not None
    return str(row["status"])


@pytest.mark.parametrize("fault", [None, "hibernate.before_park"])
def test_a_fresh_worker_finishes_runs_hibernated_by_a_killed_one(
    fault: str | None, conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    with TicketServiceThread() as tickets:
        env = worker_env(
            db_url,
            ANTHROPIC_BASE_URL=model.url,
            LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
            LEDGERLOOP_HIBERNATE_AFTER_S="0.3",
        )
        first_env = {**env, "LEDGERLOOP_FAULTS": fault} if fault else env
        approver, _ = principal_create(conn, name="alice", roles=["approver"])
        with worker_process(first_env, log=tmp_path / "w1.log") as first:
            run_id = start_test_run(conn, "ops", "db-1 disk is full")
            if fault:
                assert first.wait(timeout=60) == -9, (tmp_path / "w1.log").read_text()
                # Killed after the execution ended, before the park: still PENDING.
                assert _workflow_status(conn, run_id) == "PENDING"
            else:
                wait_until(lambda: _workflow_status(conn, run_id) == "DELAYED", timeout=30)
                first.kill()
                first.wait(timeout=30)

        with worker_process(env, log=tmp_path / "w2.log"):
            # Recovered (when it was never parked), waiting and hibernated again.
            wait_until(lambda: _workflow_status(conn, run_id) == "DELAYED", timeout=60)
            (approval,) = approval_list(conn, run_id=run_id, status="pending")
            approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
            run = wait_terminal(conn, run_id, timeout=60)
        assert run.status is RunStatus.SUCCEEDED, (tmp_path / "w2.log").read_text()
        assert httpx.get(f"{tickets.url}/_stats").json()["created"] == 1
    # The model answered each turn once: resuming replays the first turn from the journal.
    assert [r["turn"] for r in model.requests()] == [0, 1]
