"""Kill the worker (SIGKILL, a real subprocess) after a think step, and inside the next one
after its read tools ran and before its model call.

After a restart the run continues at the step that did not finish: the scripted server's
request log shows no model call made twice, and the tool log shows the read ran again only
when the step that holds it was repeated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, worker_env, worker_process
from tests.conftest import start_test_run, wait_terminal

pytestmark = pytest.mark.crash

SCRIPT = """
default:
  turns:
    - tool_use: {name: echo, input: {text: once}}
    - text: finished
"""


def _looper_env(db_url: str, model_url: str, tool_log: Path) -> dict[str, str]:
    """A worker of the test agents on `db_url`, its echo tool logging to `tool_log`."""
    return worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model_url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_TEST_TOOL_LOG=str(tool_log),
    )


@pytest.mark.parametrize(
    ("fault", "tool_runs"),
    # think.after_reads: turn 0's read ran inside think-1, which died before its model
    # call; the repeated think-1 runs the read again (it changes nothing) and pays once.
    [("loop.after_think", 1), ("think.after_reads", 2)],
)
def test_killed_worker_resumes_without_repeating_paid_or_completed_steps(
    fault: str, tool_runs: int, conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    tool_log = tmp_path / "tools.log"
    env = _looper_env(db_url, model.url, tool_log)
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
    assert len(tool_log.read_text().splitlines()) == tool_runs


def test_killed_after_the_answer_saved_resumes_to_the_saved_answer_once(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    """The answer's think step saves the run's end itself (no memory-save step). Killed after
    that commit, before the step's checkpoint: the run is succeeded in our schema while its
    workflow is not; the resumed workflow asks the model again (the step was not recorded),
    finds the save already made, and ends with the saved answer, stored once."""
    model = scripted_model(SCRIPT)
    tool_log = tmp_path / "tools.log"
    env = _looper_env(db_url, model.url, tool_log)
    fault = {**env, "LEDGERLOOP_FAULTS": "loop.after_answer_saved"}
    with worker_process(fault, log=tmp_path / "w1.log") as first:
        run_id = start_test_run(conn, "looper", "please echo")
        assert first.wait(timeout=60) == -9, (tmp_path / "w1.log").read_text()

    def workflow() -> dict[str, Any] | None:
        return conn.execute(
            "SELECT status, output FROM dbos.workflow_status WHERE workflow_uuid = %s",
            (str(run_id),),
        ).fetchone()

    before = workflow()
    assert before is not None
    assert before["status"] != "SUCCESS"
    with worker_process(env, log=tmp_path / "w2.log"):
        wait_until(lambda: (workflow() or {}).get("status") == "SUCCESS", timeout=60)
    run = wait_terminal(conn, run_id, timeout=5)
    assert run.status is RunStatus.SUCCEEDED
    assert run.state["answer"] == "finished"
    output = conn.execute(
        "SELECT output FROM dbos.workflow_output WHERE workflow_uuid = %s", (str(run_id),)
    ).fetchone()
    assert output is not None
    assert '"answer":"finished"' in output["output"].replace(" ", "")
    assert [r["turn"] for r in model.requests()] == [0, 1, 1]
    # The echo of turn 0 runs inside think-1 (a read rides the next model call), so the
    # repeated step ran it again: a read changes nothing outside.
    assert len(tool_log.read_text().splitlines()) == 2
    events = conn.execute(
        "SELECT event_type FROM ledgerloop.agent_run_event WHERE run_id = %s ORDER BY sequence",
        (run_id,),
    ).fetchall()
    # The run's status moves (typed events, such as step.finished, have a dot in their name).
    moves = [e["event_type"] for e in events if "." not in e["event_type"]]
    assert moves == ["received", "planning", "succeeded"]
    roles = conn.execute(
        "SELECT role FROM ledgerloop.conversation_message WHERE run_id = %s ORDER BY sequence",
        (run_id,),
    ).fetchall()
    assert [r["role"] for r in roles] == ["user", "assistant", "user", "assistant"]


def test_a_run_begun_under_the_step_per_read_loop_finishes_in_that_shape(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    """A run whose memory-load predates reads inside the think step (its journaled result has
    no `reads_in_think`) is resumed by this code: it keeps a step per read, so its journal
    replays and it finishes, the read run once and each turn paid once."""
    model = scripted_model(SCRIPT)
    tool_log = tmp_path / "tools.log"
    env = _looper_env(db_url, model.url, tool_log)
    fault = {**env, "LEDGERLOOP_FAULTS": "step.after:memory-load"}
    with worker_process(fault, log=tmp_path / "w1.log") as first:
        run_id = start_test_run(conn, "looper", "please echo")
        assert first.wait(timeout=60) == -9, (tmp_path / "w1.log").read_text()
    # The journal as the older loop wrote it.
    (row,) = conn.execute(
        "SELECT output FROM dbos.operation_outputs WHERE workflow_uuid = %s "
        "AND function_name = 'memory-load'",
        (str(run_id),),
    ).fetchall()
    loaded = json.loads(row["output"])
    assert loaded.pop("reads_in_think") is True
    assert loaded.pop("writes_in_think") is True  # later still
    conn.execute(
        "UPDATE dbos.operation_outputs SET output = %s WHERE workflow_uuid = %s "
        "AND function_name = 'memory-load'",
        (json.dumps(loaded), str(run_id)),
    )
    conn.commit()

    with worker_process(env, log=tmp_path / "w2.log"):
        run = wait_terminal(conn, run_id, timeout=60)
    assert run.status is RunStatus.SUCCEEDED, (tmp_path / "w2.log").read_text()
    steps = conn.execute(
        "SELECT function_name FROM dbos.operation_outputs WHERE workflow_uuid = %s "
        "ORDER BY function_id",
        (str(run_id),),
    ).fetchall()
    names = [s["function_name"].split("-toolu_")[0] for s in steps]
    assert names == ["memory-load", "think-0", "tool-0", "think-1"]
    assert [r["turn"] for r in model.requests()] == [0, 1]
    assert len(tool_log.read_text().splitlines()) == 1
