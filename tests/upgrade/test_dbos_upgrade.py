"""Upgrading DBOS under live runs: the schema is installed, and runs are started, hibernated
and left to a dead worker, by Ledgerloop on the previous DBOS minor release; then the pinned
release migrates the database (`ledgerloop db upgrade`) and a worker on it takes over.

What must still hold: a hibernated run wakes on its message, a cancel cancels, and a dead
worker's runs are recovered. The previous release is installed by the test itself into a venv
kept under .ledgerloop/ (tests/support/dbos_release.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import Approval, approval_decide, approval_list
from ledgerloop.control.cancel import cancel_run
from ledgerloop.control.timeline import dbos_client
from ledgerloop.db.connect import Conn, connect
from ledgerloop.db.migrate import schema_state
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.postgres import DatabaseFactory, wait_until
from ledgerloop.testing.processes import REPO, worker_env
from tests.conftest import start_test_run, wait_terminal
from tests.support.dbos_release import dbos_version_of, previous_minor, python_with_dbos

pytestmark = [pytest.mark.crash, pytest.mark.upgrade, pytest.mark.timeout(300)]

SCRIPT = """
default:
  turns:
    - tool_use: {name: write_ticket, input: {title: "db-1 disk full", priority: high}}
    - text: "Filed."
"""


@pytest.fixture(scope="module")
def old_python() -> Path:
    python = python_with_dbos(previous_minor())
    old, new = dbos_version_of(python), version("dbos")
    assert old.split(".")[:2] != new.split(".")[:2], (old, new)
    return python


@pytest.fixture
def empty_db(db_factory: DatabaseFactory) -> Iterator[str]:
    url = db_factory.create(migrated=False)
    yield url
    db_factory.drop(url)


def _cli(python: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(python), "-m", "ledgerloop.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@contextmanager
def _worker(python: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`ledgerloop up --no-http` on `python`; killed with SIGKILL at the end (a dead worker)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(python), "-m", "ledgerloop.cli", "up", "--no-http"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _workflow(conn: Conn, run_id: uuid.UUID) -> dict[str, Any]:
    row = conn.execute(
        "SELECT status, executor_id FROM dbos.workflow_status WHERE workflow_uuid = %s",
        (str(run_id),),
    ).fetchone()
    assert row is not None
    return dict(row)


def _parked(conn: Conn, run_id: uuid.UUID, dead_executor: str) -> bool:
    """Parked (DELAYED) by a worker other than the dead one."""
    workflow = _workflow(conn, run_id)
    return workflow["status"] == "DELAYED" and workflow["executor_id"] != dead_executor


def _waiting(conn: Conn, run_id: uuid.UUID) -> Approval:
    def pending() -> Approval | None:
        found = approval_list(conn, run_id=run_id, status="pending")
        return found[0] if found else None

    approval: Approval = wait_until(pending, timeout=60)  # type: ignore[assignment]
    return approval


def test_runs_survive_an_upgrade_from_the_previous_dbos_minor(
    old_python: Path, empty_db: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    with TicketServiceThread() as tickets, connect(empty_db, autocommit=True) as conn:
        env = worker_env(
            empty_db,
            ANTHROPIC_BASE_URL=model.url,
            LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": tickets.url}),
        )
        logs = tmp_path

        # The previous release installs the schema, DBOS's and Ledgerloop's.
        assert _cli(old_python, env, "db", "upgrade") == "schema upgraded"
        installed = schema_state(empty_db)
        old_schema = installed.dbos_current
        assert old_schema <= installed.dbos_latest
        approver, _ = principal_create(conn, name="alice", roles=["approver"])

        # On it, three runs wait for their approvals, resident in a worker that is killed.
        # (The previous release lacks the message waiters hibernation reads, so there runs
        # never hibernate: dbos_waiters degrades to "a message is arriving".)
        with _worker(old_python, env, logs / "old.log"):
            runs = [start_test_run(conn, "ops", f"disk {i} is full") for i in range(3)]
            for run_id in runs:
                _waiting(conn, run_id)
        dead_executor = _workflow(conn, runs[0])["executor_id"]
        assert {_workflow(conn, run_id)["status"] for run_id in runs} == {"PENDING"}

        # The pinned release migrates the database: DBOS's migrations, then Ledgerloop's
        # (and its objects on DBOS's tables, re-created if DBOS's migrations dropped them).
        assert _cli(Path(sys.executable), env, "db", "upgrade") == "schema upgraded"
        upgraded = schema_state(empty_db)
        assert upgraded.up_to_date, upgraded.describe()
        assert upgraded.dbos_current >= old_schema

        new_env = {**env, "LEDGERLOOP_HIBERNATE_AFTER_S": "0.3"}
        client = dbos_client(empty_db)
        try:
            with _worker(Path(sys.executable), new_env, logs / "new.log"):
                # The dead worker's runs are recovered by the new one, replay to their wait
                # and hibernate there.
                for run_id in runs:
                    wait_until(lambda r=run_id: _parked(conn, r, dead_executor), timeout=60)
                hibernated, recovered, to_cancel = runs
                # A cancel still cancels, through DBOS's API.
                cancelled = cancel_run(
                    conn, to_cancel, workflows=client, requested_by="upgrade test"
                )
                assert cancelled.workflow_cancelled
                assert _workflow(conn, to_cancel)["status"] == "CANCELLED"
                # Hibernated runs wake on their message and finish.
                for run_id in (hibernated, recovered):
                    approval = _waiting(conn, run_id)
                    approval_decide(
                        conn, approval_id=approval.id, principal=approver, decision="approve"
                    )
                for run_id in (hibernated, recovered):
                    run = wait_terminal(conn, run_id, timeout=60)
                    assert run.status is RunStatus.SUCCEEDED, (logs / "new.log").read_text()
                assert wait_terminal(conn, to_cancel).status is RunStatus.CANCELLED
        finally:
            client.destroy()
        assert httpx.get(f"{tickets.url}/_stats").json()["created"] == 2
