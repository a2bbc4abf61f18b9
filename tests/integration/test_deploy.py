"""Versioned deploys: a policy change that puts an approval in front of a tool.

Runs in flight under version 1 (policy: `ticket_idempotent` needs no approval) are checked
against version 2 (it does). The ones that already ran that write (inside `think-1`, where
a write no approval can be asked for rides) would now first run `approve-0-X`: `deploy
check` lists exactly those and exits 1. `deploy adopt` moves the others
to version 2, whose worker resumes them to the end without repeating a model call;
`deploy stop-incompatible` cancels the rest with the reason. Real worker, real DBOS journals,
the real SDK against the scripted model, the commands through the real CLI.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.cli import cli
from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_events, run_require
from ledgerloop.testing.postgres import wait_until
from tests.conftest import REPO, start_test_run, wait_terminal

# Imported here, not first by worker threads: pytest rewrites the asserts of ledgerloop's
# modules (the package ships a pytest plugin), and Python 3.11.7's ast.parse can fail when
# two threads parse at once ("AST constructor recursion depth mismatch").
for _module in ("ledgerloop.agent.write_steps", "ledgerloop.control.sweeper"):
    importlib.import_module(_module)

SCRIPT = """
conversations:
  - match: "alpha"
    turns:
      - tool_use: {name: ticket_idempotent, input: {title: "first"}}
      - tool_use: {name: patient_ticket, input: {title: "second"}}
      - text: "done"
  - match: "bravo"
    turns:
      - tool_use: {name: patient_ticket, input: {title: "only"}}
      - text: "done"
"""


def _policies(tmp_path: Path) -> tuple[Path, Path]:
    """Version 1: the test policy, approvals that wait an hour. Version 2: the same, and
    `ticket_idempotent` needs an approval too."""
    policy = yaml.safe_load((REPO / "tests" / "support" / "policy.yaml").read_text())
    policy["tools"]["patient_ticket"]["approval_ttl_s"] = 3600
    v1 = tmp_path / "policy-v1.yaml"
    v1.write_text(yaml.safe_dump(policy))
    policy["version"] = "test-2"
    policy["tools"]["ticket_idempotent"].update(
        {"requires_approval": True, "approver_roles": ["approver"], "approval_ttl_s": 3600}
    )
    v2 = tmp_path / "policy-v2.yaml"
    v2.write_text(yaml.safe_dump(policy))
    return v1, v2


def _waiting_for_approval(conn: Conn, run_id: uuid.UUID, count: int = 1) -> Any:
    def pending() -> Any:
        found = approval_list(conn, run_id=run_id, status="pending")
        return found if len(approval_list(conn, run_id=run_id)) >= count and found else None

    return wait_until(pending, timeout=30)


def _env(db_url: str, policy: Path) -> dict[str, str]:
    """The deploy commands' environment: the new version's settings and policy."""
    return {
        "LEDGERLOOP_DATABASE_URL": db_url,
        "LEDGERLOOP_AGENT_MODULES": "tests.support.agents",
        "LEDGERLOOP_POLICY_FILE": str(policy),
        "LEDGERLOOP_APPLICATION_VERSION": "ledgerloop-2",
    }


def _deploy(db_url: str, policy: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["deploy", *args], env=_env(db_url, policy))


def _workflow(conn: Conn, run_id: uuid.UUID) -> dict[str, Any]:
    row = conn.execute(
        "SELECT status, application_version FROM dbos.workflow_status WHERE workflow_uuid = %s",
        (str(run_id),),
    ).fetchone()
    assert row is not None
    return row


@pytest.mark.timeout(180)
@pytest.mark.parametrize("hibernated", [False, True], ids=["queued", "hibernated"])
def test_policy_change_adding_an_approval(
    conn: Conn, db_url: str, scripted_model: Any, worker: Any, tmp_path: Path, hibernated: bool
) -> None:
    """Queued: the old workers stopped with the runs in memory, which a clean stop puts back
    on the queue. Hibernated: the runs had waited long enough to leave memory (DELAYED)."""
    model = scripted_model(SCRIPT)
    v1_policy, v2_policy = _policies(tmp_path)
    old = worker(
        model.url,
        policy_file=v1_policy,
        application_version="ledgerloop-1",
        hibernate_after_s=1 if hibernated else 0,
    )
    approver, _ = principal_create(conn, name="ada", roles=["approver"])
    # alpha: ran its ticket (no approval in v1), now waits for the second one's approval.
    affected = [start_test_run(conn, "writer", f"alpha {i}") for i in range(2)]
    # bravo: waits for its first approval; never touched ticket_idempotent.
    unaffected = [start_test_run(conn, "writer", f"bravo {i}") for i in range(2)]
    for run_id in affected:
        _waiting_for_approval(conn, run_id)
    for run_id in unaffected:
        _waiting_for_approval(conn, run_id)
    if hibernated:
        for run_id in [*affected, *unaffected]:
            wait_until(lambda r=run_id: _workflow(conn, r)["status"] == "DELAYED", timeout=30)
    # A clean stop of every version-1 worker: the runs wait on the queue for a version-1
    # worker that will not come back.
    old.stop()

    checked = _deploy(db_url, v2_policy, "check", "--json")
    assert checked.exit_code == 1, checked.output
    report = json.loads(checked.stdout)
    verdicts = {uuid.UUID(r["run_id"]): r for r in report["runs"]}
    assert set(verdicts) == {*affected, *unaffected}
    expected_status = "DELAYED" if hibernated else "ENQUEUED"
    assert {r["workflow_status"] for r in verdicts.values()} == {expected_status}
    blocked = {run_id for run_id, r in verdicts.items() if not r["resumable"]}
    assert blocked == set(affected)
    for run_id in affected:
        verdict = verdicts[run_id]
        # Version 1 ran the write inside think-1; version 2 asks for its approval first.
        assert verdict["recorded"] == "think-1"
        assert verdict["expected"].startswith("approve-0-")
    for run_id in unaffected:
        assert verdicts[run_id]["expected"].startswith("DBOS.recv(approval:")
    # The human form names each blocked run and the step; the exit code is the same.
    human = _deploy(db_url, v2_policy, "check")
    assert human.exit_code == 1
    for run_id in affected:
        assert str(run_id) in human.stdout
    assert "2 of 4 in-flight runs would not resume" in human.stdout
    # A check changes nothing.
    assert all(_workflow(conn, r)["application_version"] == "ledgerloop-1" for r in verdicts)

    adopted = _deploy(db_url, v2_policy, "adopt", "--json")
    assert adopted.exit_code == 0, adopted.output
    assert set(map(uuid.UUID, json.loads(adopted.stdout)["adopted"])) == set(unaffected)
    for run_id in unaffected:
        assert _workflow(conn, run_id) == {
            "status": expected_status,  # a hibernated run stays parked until its message
            "application_version": "ledgerloop-2",
        }
    for run_id in affected:
        assert _workflow(conn, run_id)["application_version"] == "ledgerloop-1"

    worker(model.url, policy_file=v2_policy, application_version="ledgerloop-2")
    for run_id in unaffected:
        (approval,) = _waiting_for_approval(conn, run_id)
        approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
    for run_id in unaffected:
        assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    # Resumed, never replayed through the model: each (conversation, turn) asked once.
    calls = Counter((r["request"]["messages"][0]["content"], r["turn"]) for r in model.requests())
    assert calls
    assert max(calls.values()) == 1, calls
    assert {message for message, turn in calls if turn == 1} >= {f"bravo {i}" for i in range(2)}

    if hibernated:
        return  # stopping is the same for a parked run; once is enough
    # As an operator would: its own process, beside the running version-2 worker.
    stopped = subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", "deploy", "stop-incompatible"],
        env={**os.environ, **_env(db_url, v2_policy)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped 2 runs" in stopped.stdout
    for run_id in affected:
        run = run_require(conn, run_id)
        assert run.status is RunStatus.CANCELLED
        event = run_events(conn, run_id)[-1]
        assert event.event_type == "cancelled"
        assert event.payload["reason"] == "incompatible_deploy"
        assert event.payload["recorded_step"] == "think-1"
        assert _workflow(conn, run_id)["status"] == "CANCELLED"
        assert approval_list(conn, run_id=run_id, status="pending") == []
