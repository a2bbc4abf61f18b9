"""A cancel whose requester is killed between its commit and DBOS's cancel: the run is
cancelled, and a worker's sweep cancels its workflow through DBOS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOSClient

from ledgerloop.approvals.store import approval_list
from ledgerloop.db.connect import Conn
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_require
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, worker_env, worker_process
from tests.conftest import start_test_run, wait_terminal

pytestmark = pytest.mark.crash

SCRIPT = """
default:
  turns:
    - tool_use: {name: write_ticket, input: {title: "db-1 disk full", priority: high}}
    - text: "Filed."
"""


def test_the_sweep_finishes_a_cancel_whose_requester_died(
    conn: Conn, db_url: str, scripted_model: Any, dbos_client: DBOSClient, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    with TicketServiceThread() as tickets:
        env = worker_env(
            db_url,
            ANTHROPIC_BASE_URL=model.url,
            LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
            LEDGERLOOP_HIBERNATE_AFTER_S="0",
            LEDGERLOOP_CANCEL_SWEEP_S="0.2",
        )
        with worker_process(env, log=tmp_path / "worker.log"):
            run_id = start_test_run(conn, "ops", "db-1 disk is full")
            wait_until(lambda: approval_list(conn, run_id=run_id, status="pending"), timeout=30)
            cancel = subprocess.run(
                [sys.executable, "-m", "ledgerloop.cli", "runs", "cancel", str(run_id)],
                env={**env, "LEDGERLOOP_FAULTS": "cancel.after_commit"},
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert cancel.returncode == -9, cancel.stderr
            assert run_require(conn, run_id).status is RunStatus.CANCELLED

            def workflow() -> str:
                return str(dbos_client.retrieve_workflow(str(run_id)).get_status().status)

            wait_until(lambda: workflow() == "CANCELLED", timeout=20)
            requests = "SELECT count(*) AS n FROM ledgerloop.workflow_cancel_request"
            wait_until(lambda: conn.execute(requests).fetchone() == {"n": 0}, timeout=10)
        assert wait_terminal(conn, run_id).status is RunStatus.CANCELLED
        assert httpx_created(tickets) == 0


def httpx_created(tickets: TicketServiceThread) -> int:
    import httpx

    created: int = httpx.get(f"{tickets.url}/_stats").json()["created"]
    return created
