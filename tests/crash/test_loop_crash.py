"""Kill the worker (SIGKILL, a real subprocess) after a think step and after a tool step.

After a restart the run continues at the step that did not finish: the scripted server's
request log shows no model call made twice, and the tool log shows the tool ran once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.processes import worker_env, worker_process
from tests.conftest import start_test_run, wait_terminal

pytestmark = pytest.mark.crash

SCRIPT = """
default:
  turns:
    - tool_use: {name: echo, input: {text: once}}
    - text: finished
"""


@pytest.mark.parametrize("fault", ["loop.after_think", "loop.after_tools"])
def test_killed_worker_resumes_without_repeating_paid_or_completed_steps(
    fault: str, conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    tool_log = tmp_path / "tools.log"
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_TEST_TOOL_LOG=str(tool_log),
    )
    with worker_process({**env, "LEDGERLOOP_FAULTS": fault}, log=tmp_path / "w1.log") as first:
        run_id = start_test_run(conn, "looper", "please echo")
        assert first.wait(timeout=60) == -9, (tmp_path / "w1.log").read_text()
    assert conn.execute(
        "SELECT status FROM ledgerloop.agent_run WHERE id = %s", (run_id,)
    ).fetchone() != {"status": "succeeded"}

    with worker_process(env, log=tmp_path / "w2.log"):
        run = wait_terminal(conn, run_id, timeout=60)
    assert run.status is RunStatus.SUCCEEDED, (tmp_path / "w2.log").read_text()
    assert run.state["answer"] == "finished"
    # Each turn was paid for exactly once, and the resumed run saw the same history.
    assert [r["turn"] for r in model.requests()] == [0, 1]
    assert len(tool_log.read_text().splitlines()) == 1
