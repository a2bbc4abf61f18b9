"""A write tool without a policy entry never runs: the real start-up paths refuse it.

`ledgerloop up` (a real worker process) and `ledgerloop deploy check` load an agent module
whose write tool the policy file does not name; each exits with one error line that names the
tool and the fix, and a run of that agent started beforehand is left untouched. The control
case (the same module and policy with the entry written down) starts and runs the same run,
so the refusal is the missing entry's doing and not a broken set-up's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_events, run_require
from ledgerloop.testing.processes import REPO, start_worker, stop_worker, worker_env
from tests.conftest import start_test_run, wait_terminal

pytestmark = pytest.mark.e2e

#: A module of the user's own, importable only by the processes under test (it is never
#: imported here: its agent must not be registered in the test process).
AGENT_MODULE = """
from pydantic import BaseModel

from ledgerloop.agent.definition import Agent, register_agent
from ledgerloop.tools.registry import HttpEffect, write_tool


class TicketArgs(BaseModel):
    title: str


@write_tool(
    "file_unlisted",
    "File a ticket.",
    TicketArgs,
    HttpEffect(destination="tickets", method="POST", path="/idempotent/tickets"),
)
def file_unlisted(args: TicketArgs) -> dict[str, str]:
    return {"title": args.title, "body": "filed", "priority": "normal"}


register_agent(Agent(name="unlisted", system="Files tickets.", tools=(file_unlisted,)))
"""

SCRIPT = """
default:
  turns:
    - tool_use: {name: file_unlisted, input: {title: "db-1 disk full"}}
    - text: "Filed."
"""

UNLISTED = "version: unlisted-1\ntools: {}\n"
LISTED = "version: listed-1\ntools:\n  file_unlisted: {requires_approval: false}\n"


def _env(db_url: str, tmp_path: Path, policy: str, **extra: str) -> dict[str, str]:
    modules = tmp_path / "user_code"
    modules.mkdir(exist_ok=True)
    (modules / "unlisted_agents.py").write_text(AGENT_MODULE)
    policy_file = tmp_path / f"policy-{uuid.uuid4().hex[:6]}.yaml"
    policy_file.write_text(policy)
    return worker_env(
        db_url,
        LEDGERLOOP_AGENT_MODULES="unlisted_agents",
        LEDGERLOOP_POLICY_FILE=str(policy_file),
        PYTHONPATH=os.pathsep.join([str(REPO), str(modules)]),
        **extra,
    )


def _refusal(output: str, env: dict[str, str]) -> str:
    """The one error line the command printed, checked to name the tool, agent and fix."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    (line,) = errors
    assert "file_unlisted (agent unlisted)" in line
    assert env["LEDGERLOOP_POLICY_FILE"] in line  # which file to fix ...
    assert "requires_approval" in line  # ... and what to write in it
    return line


def _untouched(conn: Conn, run_id: uuid.UUID, status: RunStatus, model: Any) -> None:
    """Nothing of the run executed: no step, no event beyond its start, no model call."""
    assert run_require(conn, run_id).status is status
    assert [e.event_type for e in run_events(conn, run_id)] == ["received"]
    steps = conn.execute(
        "SELECT count(*) AS n FROM dbos.operation_outputs WHERE workflow_uuid = %s",
        (str(run_id),),
    ).fetchone()
    assert steps == {"n": 0}
    assert model.requests() == []
    assert effect_list(conn, run_id=run_id) == []


def _created(tickets: TicketServiceThread) -> int:
    created: int = httpx.get(f"{tickets.url}/_stats").json()["created"]
    return created


def test_a_worker_refuses_to_start_with_an_unlisted_write_tool(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    with TicketServiceThread() as tickets:
        extra = {
            "ANTHROPIC_BASE_URL": model.url,
            "LEDGERLOOP_DESTINATIONS": json.dumps({"tickets": tickets.url}),
        }
        run_id = start_test_run(conn, "unlisted", "file it")
        queued = run_require(conn, run_id).status
        env = _env(db_url, tmp_path, UNLISTED, **extra)
        log = tmp_path / "refused.log"
        refused = start_worker(env, log=log)
        try:
            assert refused.wait(timeout=60) == 2, log.read_text()
        finally:
            stop_worker(refused)
        _refusal(log.read_text(), env)
        # It refused before it registered or launched DBOS: no executor row, no step, no call.
        assert conn.execute("SELECT count(*) AS n FROM ledgerloop.executor").fetchone() == {"n": 0}
        _untouched(conn, run_id, queued, model)
        assert _created(tickets) == 0

        # The control: with the rule written down, the same worker starts and runs that run.
        listed = _env(db_url, tmp_path, LISTED, **extra)
        worker = start_worker(listed, log=tmp_path / "listed.log")
        try:
            run = wait_terminal(conn, run_id, timeout=60)
        finally:
            stop_worker(worker)
        assert run.status is RunStatus.SUCCEEDED, (tmp_path / "listed.log").read_text()
        assert _created(tickets) == 1


def _deploy_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", "deploy", "check"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_deploy_check_refuses_an_unlisted_write_tool(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    """A deploy check of a policy that drops a write tool's entry says so (exit 2: could not
    check), rather than passing a deploy whose workers would all refuse to start."""
    model = scripted_model(SCRIPT)
    run_id = start_test_run(conn, "unlisted", "file it")
    queued = run_require(conn, run_id).status

    env = _env(db_url, tmp_path, UNLISTED, ANTHROPIC_BASE_URL=model.url)
    refused = _deploy_check(env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    _refusal(refused.stderr, env)
    _untouched(conn, run_id, queued, model)

    # The control: the same module with its entry passes (the run in flight would resume).
    passed = _deploy_check(_env(db_url, tmp_path, LISTED, ANTHROPIC_BASE_URL=model.url))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "0 of 1 in-flight runs would not resume" in passed.stdout
