"""Sandbox tools in the durable loop: steps, offloaded output, files out, approval waits, and
the sandbox of a run that fails or is cancelled.

Real Postgres, a real DBOS worker, the real SDK against the scripted model, real bubblewrap
(and gVisor where a case runs under both).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.control.cancel import cancel_run
from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.sandbox import SandboxHost
from ledgerloop.sandbox.backends import processes_of_uid
from ledgerloop.testing.postgres import wait_until
from ledgerloop.tools.payloads import payload_get
from tests.conftest import REPO, journal_steps, start_test_run, wait_terminal
from tests.support.sandbox_checks import gvisor_containers, leased_uids, processes_naming

POLICY = REPO / "tests" / "support" / "sandbox_policy.yaml"


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    # Not under pytest's tmp_path: a sandbox's own uid must be able to reach its directory.
    root = Path(tempfile.mkdtemp(prefix="ll-sandbox-loop-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def coder(worker: Any, sandbox_root: Path) -> Any:
    def start(model_url: str, **overrides: Any) -> Any:
        return worker(
            model_url,
            agent_modules="tests.support.sandbox_agents",
            policy_file=POLICY,
            sandbox_root=sandbox_root,
            **overrides,
        )

    return start


def _tool_results(model: Any, request: int = -1) -> list[dict[str, Any]]:
    last = model.requests()[request]["request"]["messages"][-1]
    return [b for b in last["content"] if b.get("type") == "tool_result"]


ANALYSE = """
import csv
rows = list(csv.DictReader(open("query_latency.csv")))
worst = max(rows, key=lambda r: int(r["p99_ms"]))
print("worst", worst["service"], worst["hour"], worst["p99_ms"])
open("report.txt", "w").write("worst p99 " + worst["p99_ms"])
print("z" * 100_000)
"""


def test_run_code_runs_in_a_sandbox_as_steps_and_offloads_large_output(
    conn: Conn, scripted_model: Any, coder: Any, sandbox_root: Path
) -> None:
    script = {
        "default": {
            "turns": [
                {"tool_use": {"name": "run_code", "input": {"code": ANALYSE}}},
                {"text": "billing at 08"},
            ]
        }
    }
    model = scripted_model(json.dumps(script))
    coder(model.url)
    run_id = start_test_run(conn, "coder", "which hour was worst?")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED, run.state
    (result,) = _tool_results(model)
    assert not result["is_error"], result
    # The model saw a preview and a reference; the payload holds the whole output.
    assert "payload" in result["content"]
    payload = payload_get(conn, uuid.UUID(result["payload_ref"]))
    assert payload is not None
    report = json.loads(payload["content"])
    assert report["exit_code"] == 0
    assert report["stdout"].startswith("worst billing 08 1480")
    assert report["files"] == [{"name": "report.txt", "bytes": 14, "content": "worst p99 1480"}]
    steps = journal_steps(conn, run_id)
    call_id = model.requests()[-1]["request"]["messages"][1]["content"][0]["id"]
    for name in (f"sandbox-create-0-{call_id}", f"tool-0-{call_id}", "sandbox-destroy-0"):
        assert steps.count(name) == 1, steps
    assert SandboxHost(sandbox_root).ids() == []


def test_a_run_waiting_for_approval_holds_no_sandbox(
    conn: Conn, scripted_model: Any, coder: Any, sandbox_root: Path
) -> None:
    turns = [
        {
            "tool_use": {
                "name": "run_code",
                "input": {"code": "open('state.txt','w').write('before the wait')"},
            }
        },
        {"tool_use": {"name": "write_ticket", "input": {"title": "check billing"}}},
        {"tool_use": {"name": "run_code", "input": {"code": "print(open('state.txt').read())"}}},
        {"text": "done"},
    ]
    model = scripted_model(json.dumps({"default": {"turns": turns}}))
    coder(model.url)
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    run_id = start_test_run(conn, "coder", "analyse then file")
    host = SandboxHost(sandbox_root)

    def pending() -> Any:
        found = approval_list(conn, run_id=run_id, status="pending")
        return found[0] if found else None

    approval = wait_until(pending, timeout=30)
    # While it waits: no sandbox directory, no sandbox process, and /work kept as a payload.
    assert host.ids() == []
    assert host.running() == []
    snapshots = conn.execute(
        "SELECT id FROM ledgerloop.payload WHERE run_id = %s AND kind = 'sandbox_snapshot'",
        (run_id,),
    ).fetchall()
    assert len(snapshots) == 1
    # Its uid was given back with the directory: no lease, no process of the sandbox.
    assert leased_uids(host) == []
    assert processes_naming(host.root) == []
    approval_decide(conn, approval_id=approval.id, principal=approver, decision="approve")
    run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED, run.state
    (restored,) = _tool_results(model)
    assert json.loads(restored["content"])["stdout"] == "before the wait\n"
    steps = journal_steps(conn, run_id)
    assert any(step.startswith("sandbox-save-1-") for step in steps), steps
    assert any(step.startswith("sandbox-restore-2-") for step in steps), steps
    assert host.ids() == []


def test_a_failing_script_is_an_error_result_and_the_sandbox_is_destroyed(
    conn: Conn, scripted_model: Any, coder: Any, sandbox_root: Path
) -> None:
    turns = [
        {"tool_use": {"name": "run_code", "input": {"code": "raise SystemExit(3)"}}},
        {"text": "it failed"},
    ]
    model = scripted_model(json.dumps({"default": {"turns": turns}}))
    coder(model.url)
    run = wait_terminal(conn, start_test_run(conn, "coder", "fail"))
    assert run.status is RunStatus.SUCCEEDED
    (result,) = _tool_results(model)
    assert result["is_error"]
    assert json.loads(result["content"])["exit_code"] == 3
    assert SandboxHost(sandbox_root).ids() == []


# -- the sandbox of a run that fails or is cancelled ------------------------------------------

BOTH = ["bwrap", "gvisor"]
#: The sandbox tool of each backend, and the name of its argument holding the Python code.
SANDBOX_TOOLS = {"bwrap": ("run_code", "code"), "gvisor": ("run_code_gvisor", "script")}


def _run_python(backend: str, code: str) -> dict[str, Any]:
    tool, argument = SANDBOX_TOOLS[backend]
    return {"tool_use": {"name": tool, "input": {argument: code}}}


def _nothing_left(host: SandboxHost, uid: int | None = None) -> bool:
    """No directory, no command, no uid lease (nor a process of the uid it had, when known)
    and no gVisor container."""
    return (
        host.ids() == []
        and host.running() == []
        and leased_uids(host) == []
        and (uid is None or processes_of_uid(uid) == [])
        and gvisor_containers(host) == []
        and processes_naming(host.root) == []
    )


@pytest.mark.parametrize("backend", BOTH)
def test_a_run_that_fails_destroys_its_sandbox(
    conn: Conn, scripted_model: Any, coder: Any, sandbox_root: Path, backend: str
) -> None:
    turns = [
        _run_python(backend, "open('state.txt', 'w').write('made')\nprint('made')"),
        {"tool_use": {"name": "broken_lookup", "input": {"key": "kf-1"}}},
        {"text": "never reached"},
    ]
    model = scripted_model(json.dumps({"default": {"turns": turns}}))
    coder(model.url)
    run_id = start_test_run(conn, "coder", "make a file, then look something up")
    run = wait_terminal(conn, run_id)
    assert (run.status, run.state["reason"]) == (RunStatus.FAILED, "internal_error"), run.state
    assert run.state["error"]["type"] == "KeyError"
    # The sandbox was live when the tool raised: its command had run in it.
    (made,) = _tool_results(model)
    assert json.loads(made["content"])["stdout"] == "made\n"
    steps = journal_steps(conn, run_id)
    call_id = model.requests()[1]["request"]["messages"][1]["content"][0]["id"]
    # The read tool of turn 1 runs inside think-2, the step that raised.
    failing = "think-2"
    assert not [step for step in steps if step.startswith("tool-1-")], steps
    # Destroyed by a step of its own, after the tool that raised and before the run's finish.
    assert steps.count("sandbox-destroy-0") == 1, steps
    assert steps.index(failing) < steps.index("sandbox-destroy-0")
    assert steps.index("sandbox-destroy-0") < steps.index("finish")
    sandbox_id = uuid.uuid5(run_id, f"sandbox:{SANDBOX_TOOLS[backend][0]}:0:{call_id}").hex
    host = SandboxHost(sandbox_root)
    assert not host.exists(sandbox_id)
    assert _nothing_left(host)


@pytest.mark.parametrize("backend", BOTH)
def test_a_run_cancelled_mid_command_leaves_no_sandbox(
    conn: Conn, scripted_model: Any, coder: Any, sandbox_root: Path, backend: str
) -> None:
    # Longer than the test waits below: only the cancel can stop it in time.
    sleeper = "import time\nprint('started', flush=True)\ntime.sleep(120)"
    turns = [_run_python(backend, sleeper), {"text": "never reached"}]
    model = scripted_model(json.dumps({"default": {"turns": turns}}))
    coder(model.url, sandbox_reap_interval_s=0.2, cancel_sweep_s=0.2)
    run_id = start_test_run(conn, "coder", "run forever")
    host = SandboxHost(sandbox_root)
    wait_until(host.running, timeout=30)
    (sandbox_id,) = host.ids()
    uid = host.get(sandbox_id).uid
    assert (uid is not None) == (backend == "bwrap")

    cancel_run(conn, run_id, workflows=DBOS, requested_by="test")
    assert wait_terminal(conn, run_id).status is RunStatus.CANCELLED
    wait_until(lambda: _nothing_left(host, uid), timeout=15)
    assert len(model.requests()) == 1  # nothing after the cancel
    # A run cancelled from outside runs no step after the cancel, its destroy step included:
    # the reaper takes the sandbox of a run that is over, command and all (act_sandbox.py).
