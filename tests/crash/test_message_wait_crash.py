"""SIGKILL a worker while its run waits in `wait_for_message`, then send the message: another
worker finishes the run with it. Waiting resident (the run is PENDING under the dead worker,
recovered by heartbeat) or hibernated (parked, woken by the message's own transaction)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.approvals.principals import principal_create
from ledgerloop.client import Client
from ledgerloop.db.connect import Conn
from ledgerloop.http.app import create_app
from ledgerloop.runs.states import RunStatus
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, worker_env, worker_process
from tests.conftest import journal_steps, start_test_run, wait_terminal
from tests.e2e.conftest import ServerThread

pytestmark = pytest.mark.crash

LOOP_SCRIPT = """
default:
  turns:
    - tool_use: {name: hold, input: {}}
    - tool_use: {name: echo, input: {text: hi}}
    - text: done
"""


def _workflow_status(conn: Conn, run_id: uuid.UUID) -> str:
    row = conn.execute(
        "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s", (str(run_id),)
    ).fetchone()
    assert row is not None
    return str(row["status"])


@pytest.mark.parametrize("hibernate_after_s", ["0", "0.3"])
def test_a_killed_waiter_resumes_on_another_worker_with_the_message(
    hibernate_after_s: str, conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=scripted_model("default:\n  turns:\n    - text: unused\n").url,
        LEDGERLOOP_AGENT_MODULES="tests.support.message_agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_HIBERNATE_AFTER_S=hibernate_after_s,
    )
    _, token = principal_create(conn, name="cy@example.com", roles=("runner",))
    run_id = start_test_run(conn, "listener", "wait for me")
    with worker_process(env, log=tmp_path / "w1.log") as first:
        wait_until(lambda: "message-wait-1" in journal_steps(conn, run_id), timeout=60)
        if hibernate_after_s != "0":
            wait_until(lambda: _workflow_status(conn, run_id) == "DELAYED", timeout=30)
        first.kill()
        assert first.wait(timeout=30) == -9
    assert _workflow_status(conn, run_id) in ("PENDING", "DELAYED")
    with (
        ServerThread(create_app(db_url, agent_names={"listener"})) as server,
        Client(server.url, token) as api,
    ):
        sent = api.send_message(str(run_id), "carry on", idempotency_key="after-kill")
    with worker_process(env, log=tmp_path / "w2.log"):
        run = wait_terminal(conn, run_id, timeout=90)
    assert run.status is RunStatus.SUCCEEDED, (tmp_path / "w2.log").read_text()
    assert run.state["text"] == "carry on"
    assert run.state["first_timed_out"] is True
    # The first wait's timeout is in the journal: the resumed run did not wait it again.
    steps = journal_steps(conn, run_id)
    assert steps.count("message-wait-0") == 1
    assert steps.count("message-wait-1") == 1
    row = conn.execute(
        "SELECT count(*) AS n FROM ledgerloop.run_message WHERE run_id = %s", (run_id,)
    ).fetchone()
    assert row is not None
    assert row["n"] == 1
    assert sent["run_id"] == str(run_id)


def test_a_worker_killed_right_after_taking_a_message_replays_it_once(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(LOOP_SCRIPT)
    hold = tmp_path / "hold"
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.message_agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_TEST_HOLD_FILE=str(hold),
    )
    _, token = principal_create(conn, name="dee@example.com", roles=("runner",))
    run_id = start_test_run(conn, "chatty", "look at db-1")
    with (
        ServerThread(create_app(db_url, agent_names={"chatty"})) as server,
        Client(server.url, token) as api,
    ):
        # Killed once `messages-2` is recorded, before the reads it comes after and think-2.
        killing = {**env, "LEDGERLOOP_FAULTS": "step.after:messages-2"}
        with worker_process(killing, log=tmp_path / "w1.log") as first:
            wait_until(lambda: Path(f"{hold}.reached").exists(), timeout=60)
            api.send_message(str(run_id), "CHARLIE: db-4 as well", idempotency_key="charlie")
            hold.touch()
            assert first.wait(timeout=60) == -9, (tmp_path / "w1.log").read_text()
        # Sent while no worker runs: it must not join the turn the journal already took.
        api.send_message(str(run_id), "DELTA: later", idempotency_key="delta")
    with worker_process(env, log=tmp_path / "w2.log"):
        run = wait_terminal(conn, run_id, timeout=90)
    assert run.status is RunStatus.SUCCEEDED, (tmp_path / "w2.log").read_text()
    requests = [r["request"]["messages"] for r in model.requests()]
    last = json.dumps(requests[-1])
    # The journaled take is replayed (once); DELTA came after it and waits for a later
    # boundary, which this run (it answered) never reached.
    assert last.count("CHARLIE: db-4 as well") == 1
    assert "DELTA" not in last
    steps = journal_steps(conn, run_id)
    assert steps.count("messages-2") == 1
    (echo_step,) = [s for s in steps if s.startswith("tool-1-")]
    assert steps.index("messages-2") + 1 == steps.index(echo_step)
