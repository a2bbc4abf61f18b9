"""`ledgerloop workers` and `ledgerloop runs stuck` against a real database: the rows are
written the way workers and takeovers leave them, and the commands must report them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest
from typer.testing import CliRunner, Result

from ledgerloop.cli import cli
from ledgerloop.db.connect import Conn
from ledgerloop.fleet.fence import Fence
from ledgerloop.fleet.heartbeat import FleetTimings, Heartbeat
from ledgerloop.testing.processes import REPO

Invoke = Callable[..., Result]


@pytest.fixture
def run_cli(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    monkeypatch.setenv("LEDGERLOOP_DATABASE_URL", db_url)
    monkeypatch.setenv("LEDGERLOOP_POLICY_FILE", str(REPO / "tool_policy.yaml"))
    monkeypatch.setenv("COLUMNS", "250")
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(cli, list(args))

    return run


def table(output: str) -> dict[str, list[str]]:
    """A rich table's rows by their first cell."""
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in output.splitlines()]
    return {row[0]: row for row in rows if row and row[0]}


def start(conn: Conn, message: str) -> uuid.UUID:
    row = conn.execute(
        "SELECT ledgerloop.start_run('ops', %s::jsonb) AS id", (json.dumps({"message": message}),)
    ).fetchone()
    assert row is not None
    run_id: uuid.UUID = row["id"]
    return run_id


def test_workers_lists_identity_host_versions_heartbeat_and_runs(
    conn: Conn, db_url: str, run_cli: Invoke
) -> None:
    timings = FleetTimings()
    heartbeat = Heartbeat(db_url, "w-live", "ledgerloop-1", timings, Fence(timings.lease_s))
    heartbeat.register()
    try:
        run_id = start(conn, "hello")
        conn.execute(
            "UPDATE dbos.workflow_status SET status = 'PENDING', executor_id = 'w-live' "
            "WHERE workflow_uuid = %s",
            (str(run_id),),
        )
        conn.execute(
            "INSERT INTO ledgerloop.executor (id, application_version, hostname, pid, "
            "heartbeat_at) VALUES ('w-silent', 'ledgerloop-0', 'far', 7, now() - interval '1 min')"
        )
        result = run_cli("workers")
    finally:
        heartbeat.stop()
    assert result.exit_code == 0, result.output
    rows = table(result.output)
    live, silent = rows["w-live"], rows["w-silent"]
    assert live[3] == "ledgerloop-1"
    assert live[7] == "1"  # one run executing
    assert "(silent)" not in live[6]
    assert silent[1] == "far"
    assert "(silent)" in silent[6]
    assert silent[7] == "0"


def test_runs_stuck_names_each_kind_of_problem_and_exits_1(conn: Conn, run_cli: Invoke) -> None:
    assert run_cli("runs", "stuck").output.strip() == "no stuck runs"

    orphan = start(conn, "orphan")  # PENDING under a worker that is gone
    conn.execute(
        "UPDATE dbos.workflow_status SET status = 'PENDING', executor_id = 'gone' "
        "WHERE workflow_uuid = %s",
        (str(orphan),),
    )
    ended = start(conn, "ended")  # the workflow ended, the run did not, a minute ago
    conn.execute(
        "UPDATE dbos.workflow_status SET status = 'ERROR' WHERE workflow_uuid = %s",
        (str(ended),),
    )
    conn.execute(
        "UPDATE ledgerloop.agent_run SET updated_at = now() - interval '1 minute' WHERE id = %s",
        (ended,),
    )
    # A run that just ended: its status commits inside its last step, a moment before DBOS
    # closes its workflow. Every run passes through this; none is stuck.
    ending = start(conn, "ending")
    conn.execute(
        "INSERT INTO ledgerloop.executor (id, application_version, hostname, pid, "
        "heartbeat_at) VALUES ('w-live', 'ledgerloop-1', 'here', 7, now())"
    )
    conn.execute("UPDATE ledgerloop.agent_run SET status = 'succeeded' WHERE id = %s", (ending,))
    conn.execute(
        "UPDATE dbos.workflow_status SET status = 'PENDING', executor_id = 'w-live' "
        "WHERE workflow_uuid = %s",
        (str(ending),),
    )
    fine = start(conn, "fine")  # queued for any version: nothing to report
    result = run_cli("runs", "stuck")
    assert result.exit_code == 1, result.output
    rows = table(result.output)
    assert rows[str(orphan)][-1] == "pending, its worker is gone"
    assert rows[str(ended)][-1] == "run received, workflow ERROR"
    assert str(fine) not in result.output
    assert str(ending) not in result.output
