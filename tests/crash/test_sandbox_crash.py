"""Kill the worker (SIGKILL) while its sandboxed command runs under gVisor.

The gVisor container outlives the worker (it is not the worker's child process tree alone),
so this is the case the reaper exists for: after the restart no container is left, the run
finishes, and the command's step is journaled once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.sandbox import SandboxHost
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import (
    REPO,
    release,
    standby_worker,
    stop_all,
    worker_env,
    worker_process,
)
from tests.conftest import start_test_run, wait_terminal

pytestmark = pytest.mark.crash

CODE = """
import os, time
if not os.path.exists("attempt"):
    open("attempt", "w").write("first")
    time.sleep(600)
print("second attempt")
"""


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="ll-sandbox-crash-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _containers(root: Path) -> list[str]:
    out = subprocess.run(
        ["runsc", "--rootless", "--root", str(root / ".runsc"), "list", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [name for name in out.split() if name.startswith("ll-")]


def test_worker_killed_mid_command_leaves_no_sandbox_and_journals_the_step_once(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path, sandbox_root: Path
) -> None:
    turns = [
        {"tool_use": {"name": "run_code_gvisor", "input": {"script": CODE}}},
        {"text": "done"},
    ]
    model = scripted_model(json.dumps({"default": {"turns": turns}}))
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.sandbox_agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "sandbox_policy.yaml"),
        LEDGERLOOP_SANDBOX_ROOT=str(sandbox_root),
    )
    faulty = {**env, "LEDGERLOOP_FAULTS": "sandbox.during_command"}
    # The worker that restarts, held after its imports: its start-up overlaps the first's.
    second = standby_worker(env, log=tmp_path / "w2.log")
    try:
        with worker_process(faulty, log=tmp_path / "w1.log") as first:
            run_id = start_test_run(conn, "coder", "run it")
            assert first.wait(timeout=60) == -9, (tmp_path / "w1.log").read_text()
        # The worker is gone and its container still runs the command.
        wait_until(lambda: list(sandbox_root.glob("*/work/attempt")), timeout=30)
        assert len(_containers(sandbox_root)) == 1
        release(second)
        run = wait_terminal(conn, run_id, timeout=60)
    finally:
        stop_all(second)
    assert run.status is RunStatus.SUCCEEDED, (tmp_path / "w2.log").read_text()
    last = model.requests()[-1]["request"]["messages"][-1]["content"][0]
    assert json.loads(last["content"])["stdout"] == "second attempt\n"
    call_id = last["tool_use_id"]
    journaled = conn.execute(
        "SELECT count(*) AS n FROM dbos.operation_outputs "
        "WHERE workflow_uuid = %s AND function_name = %s",
        (str(run_id), f"tool-0-{call_id}"),
    ).fetchone()
    assert journaled == {"n": 1}
    assert _containers(sandbox_root) == []
    assert SandboxHost(sandbox_root).ids() == []
