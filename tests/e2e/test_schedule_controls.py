"""Operators' controls over schedules: the CLI and the HTTP API (roles, tenants)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime

import httpx
import pytest
from typer.testing import CliRunner

from ledgerloop.cli import cli
from ledgerloop.db.connect import Conn
from ledgerloop.schedules.definition import Schedule
from ledgerloop.schedules.store import schedule_declare, schedule_get
from ledgerloop.testing.processes import REPO, worker_env
from tests.e2e.conftest import MakeToken, bearer

NIGHTLY = Schedule("nightly-triage", "0 2 * * *", {"message": "triage"}, agent="ops")


@pytest.fixture
def declared(conn: Conn) -> Schedule:
    schedule_declare(conn, NIGHTLY, datetime.now(UTC))
    return NIGHTLY


def test_cli_lists_pauses_resumes_and_triggers(
    conn: Conn, db_url: str, declared: Schedule, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGERLOOP_DATABASE_URL", db_url)
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(cli, ["schedules", *args])
        assert result.exit_code == 0, result.output
        return result.output

    listed = json.loads(run("list", "--json"))
    assert [(s["name"], s["cron"], s["paused"]) for s in listed] == [
        ("nightly-triage", "0 2 * * *", False)
    ]
    assert "paused" in run("pause", "nightly-triage")
    assert schedule_get(conn, "nightly-triage").paused
    run("resume", "nightly-triage")
    assert not schedule_get(conn, "nightly-triage").paused
    run_id = uuid.UUID(run("trigger", "nightly-triage", "--key", "k1").strip())
    assert uuid.UUID(run("trigger", "nightly-triage", "--key", "k1").strip()) == run_id
    row = conn.execute("SELECT agent, input FROM ledgerloop.agent_run WHERE id = %s", (run_id,))
    assert row.fetchone() == {"agent": "ops", "input": {"message": "triage"}}
    missing = runner.invoke(cli, ["schedules", "pause", "nope"])
    assert missing.exit_code == 2
    assert "no schedule is named 'nope'" in missing.output


def test_http_reads_for_any_token_and_changes_for_operators_of_the_tenant(
    conn: Conn, http: httpx.Client, make_token: MakeToken, declared: Schedule
) -> None:
    viewer, operator = make_token("viewer"), make_token("operator")
    stranger = make_token("operator", tenant=uuid.uuid4())
    listed = http.get("/v1/schedules", headers=bearer(viewer)).json()["schedules"]
    assert [s["name"] for s in listed] == ["nightly-triage"]
    assert http.get("/v1/schedules", headers=bearer(stranger)).json() == {"schedules": []}
    assert http.post("/v1/schedules/nightly-triage/pause").status_code == 401
    assert (
        http.post("/v1/schedules/nightly-triage/pause", headers=bearer(viewer)).status_code == 403
    )
    assert (
        http.post("/v1/schedules/nightly-triage/pause", headers=bearer(stranger)).status_code == 404
    )
    paused = http.post("/v1/schedules/nightly-triage/pause", headers=bearer(operator))
    assert paused.status_code == 200
    assert paused.json()["paused"] is True
    resumed = http.post("/v1/schedules/nightly-triage/resume", headers=bearer(operator))
    assert resumed.json()["paused"] is False
    headers = {**bearer(operator), "Idempotency-Key": "op-7"}
    first = http.post("/v1/schedules/nightly-triage/trigger", headers=headers)
    assert first.status_code == 201
    again = http.post("/v1/schedules/nightly-triage/trigger", headers=headers)
    assert again.json()["run_id"] == first.json()["run_id"]
    assert schedule_get(conn, "nightly-triage").last_run_id == uuid.UUID(first.json()["run_id"])


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        ("agent", "schedule 'nightly' is for agent 'ghost', which no module"),
        ("cron", "schedule 'nightly': cron '0 2 * *' does not parse: '0 2 * *' has 4 fields"),
    ],
)
def test_a_worker_with_a_wrong_schedule_refuses_to_start(
    db_url: str, wrong: str, says: str
) -> None:
    env = worker_env(
        db_url,
        LEDGERLOOP_AGENT_MODULES="ledgerloop.examples.ops_agent,tests.support.bad_schedules",
        LEDGERLOOP_TEST_BAD_SCHEDULE=wrong,
    )
    done = subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", "up", "--no-http"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
