"""POST /v1/runs/{id}/messages over real HTTP: durable and idempotent, refused with the reason,
and read by real worker processes at the loop's next turn boundary or in wait_for_message."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from ledgerloop.cli import cli
from ledgerloop.client import ApiError, AsyncClient, Client
from ledgerloop.db.connect import Conn
from ledgerloop.effects.testing import messages_for
from ledgerloop.http.app import create_app
from ledgerloop.runs.messages import MAX_MESSAGE_CHARS, MESSAGE_TOPIC
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_require, run_transition
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, worker_env, worker_process
from tests.conftest import journal_steps, start_test_run, wait_terminal
from tests.e2e.conftest import TENANT_B, MakeToken, ServerThread, bearer

pytestmark = pytest.mark.e2e


def post(
    http: httpx.Client, run_id: Any, token: str, body: Any, key: str | None = "k1"
) -> httpx.Response:
    headers = bearer(token) | ({"Idempotency-Key": key} if key is not None else {})
    return http.post(f"/v1/runs/{run_id}/messages", json=body, headers=headers)


def stored(conn: Conn, run_id: Any) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT id, idempotency_key, content, sent_by FROM ledgerloop.run_message "
        "WHERE run_id = %s ORDER BY created_at",
        (run_id,),
    ).fetchall()


def test_same_key_same_message_and_every_refusal(
    http: httpx.Client, conn: Conn, make_token: MakeToken
) -> None:
    runner = make_token("runner", name="ana@example.com")
    run_id = start_test_run(conn, "looper", "hello")

    first = post(http, run_id, runner, {"content": "also check db-2"})
    assert first.status_code == 202, first.text
    again = post(http, run_id, runner, {"content": "also check db-2"})
    assert again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert first.json()["sent_by"] == "ana@example.com"
    assert first.json()["consumed_at"] is None
    # One row, one wake-up for the run (DBOS's message, sent in the same transaction).
    rows = stored(conn, run_id)
    assert [(str(r["id"]), r["content"]) for r in rows] == [
        (first.json()["id"], {"text": "also check db-2"})
    ]
    wakes = messages_for(conn, run_id, MESSAGE_TOPIC)
    assert [w["message"] for w in wakes] == [{"message_id": first.json()["id"]}]

    reused = post(http, run_id, runner, {"content": "something else"})
    assert reused.status_code == 422
    assert reused.json()["error"]["type"] == "message_key_reused"
    assert "different content" in reused.json()["error"]["message"]

    missing = post(http, run_id, runner, {"content": "x"}, key=None)
    assert missing.status_code == 400
    assert "Idempotency-Key" in missing.json()["error"]["message"]

    too_long = post(http, run_id, runner, {"content": "x" * (MAX_MESSAGE_CHARS + 1)}, key="k2")
    assert too_long.status_code == 413
    assert str(MAX_MESSAGE_CHARS) in too_long.json()["error"]["message"]
    too_big = post(http, run_id, runner, {"content": "x" * (300 * 1024)}, key="k3")
    assert too_big.status_code == 413

    assert post(http, run_id, runner, {"content": ""}, key="k4").status_code == 422
    assert post(http, run_id, runner, {"content": "x", "role": "system"}, key="k5").status_code == (
        422
    )
    viewer = make_token("viewer")
    assert post(http, run_id, viewer, {"content": "x"}, key="k6").status_code == 403
    assert post(http, run_id, "nope", {"content": "x"}, key="k7").status_code == 401
    other = make_token("runner", tenant=TENANT_B)
    assert post(http, run_id, other, {"content": "x"}, key="k8").status_code == 404
    assert post(http, uuid.uuid4(), runner, {"content": "x"}, key="k9").status_code == 404
    # None of the refused requests left a row or a wake-up behind.
    assert len(stored(conn, run_id)) == 1
    assert len(messages_for(conn, run_id, MESSAGE_TOPIC)) == 1


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.CANCELLED])
def test_a_finished_or_cancelled_run_refuses_a_new_message(
    http: httpx.Client, conn: Conn, make_token: MakeToken, status: RunStatus
) -> None:
    runner = make_token("runner")
    run_id = start_test_run(conn, "looper", "hello")
    assert post(http, run_id, runner, {"content": "before"}, key="early").status_code == 202
    run = run_transition(conn, run_require(conn, run_id), RunStatus.PLANNING, "planning", {}).run
    run_transition(conn, run, status, status.value, {"reason": "test"})
    late = post(http, run_id, runner, {"content": "after"}, key="late")
    assert late.status_code == 409
    assert status.value in late.json()["error"]["message"]
    # A repeat of a message the run already has is still answered with it.
    repeat = post(http, run_id, runner, {"content": "before"}, key="early")
    assert repeat.status_code == 202
    assert [r["idempotency_key"] for r in stored(conn, run_id)] == ["early"]


def test_clients_send_messages(server: ServerThread, conn: Conn, make_token: MakeToken) -> None:
    import asyncio

    runner = make_token("runner")
    run_id = str(start_test_run(conn, "looper", "hello"))
    with Client(server.url, runner) as api:
        one = api.send_message(run_id, "sync", idempotency_key="s1")
        assert api.send_message(run_id, "sync", idempotency_key="s1")["id"] == one["id"]
        with pytest.raises(ApiError) as refused:
            api.send_message(run_id, "other", idempotency_key="s1")
        assert refused.value.status == 422

    async def main() -> dict[str, Any]:
        async with AsyncClient(server.url, runner) as api:
            return await api.send_message(run_id, "async", idempotency_key="a1")

    two = asyncio.run(main())
    assert [r["content"]["text"] for r in stored(conn, run_id)] == ["sync", "async"]
    assert two["idempotency_key"] == "a1"


LOOP_SCRIPT = """
default:
  turns:
    - tool_use: {name: hold, input: {}}
    - tool_use: {name: echo, input: {text: hi}}
    - text: done
"""


def _texts(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return json.dumps(content)


def test_loop_reads_messages_at_its_turn_boundaries(
    conn: Conn, db_url: str, scripted_model: Any, make_token: MakeToken, tmp_path: Path
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
    runner = make_token("runner")
    with (
        ServerThread(create_app(db_url, agent_names={"chatty"})) as server,
        Client(server.url, runner) as api,
    ):
        run_id = str(start_test_run(conn, "chatty", "look at db-1"))
        # Before any worker: taken at the first boundary its first execution reaches.
        for _ in range(2):
            api.send_message(run_id, "ALPHA: db-2 too", idempotency_key="alpha")
        with worker_process(env, log=tmp_path / "worker.log"):
            wait_until(lambda: Path(f"{hold}.reached").exists(), timeout=60)
            # Mid-turn: the worker is told of it and takes it at the next boundary.
            for _ in range(2):
                api.send_message(run_id, "BRAVO: and db-3", idempotency_key="bravo")
            hold.touch()
            run = wait_terminal(conn, run_id, timeout=60)
    log = (tmp_path / "worker.log").read_text()
    assert run.status is RunStatus.SUCCEEDED, log

    requests = [r["request"]["messages"] for r in model.requests()]
    assert len(requests) == 3
    first, _, last = requests
    assert "ALPHA: db-2 too" in _texts(first[0])  # with the run's own input
    assert "BRAVO" not in json.dumps(requests[1])
    # Once each, in order, after the tool results of the turn before.
    whole = json.dumps(last)
    assert whole.count("ALPHA: db-2 too") == 1
    assert whole.count("BRAVO: and db-3") == 1
    assert last[-1]["role"] == "user"
    assert "BRAVO: and db-3" in _texts(last[-1])
    assert "tool_result" in _texts(last[-1])
    steps = journal_steps(conn, uuid.UUID(run_id))
    assert "messages-0" in steps, steps
    assert "messages-2" in steps, steps
    assert not any(s.startswith("messages-1") for s in steps)
    # The take comes before the echo it follows in the conversation (that read, which would
    # have ridden think-2, ran as a step of its own): the journal holds the decision first.
    (echo_step,) = [s for s in steps if s.startswith("tool-1-")]
    assert steps.index("messages-2") + 1 == steps.index(echo_step) < steps.index("think-2")
    # The conversation memory holds each message once.
    saved = conn.execute(
        "SELECT content FROM ledgerloop.conversation_message WHERE run_id = %s",
        (run_id,),
    ).fetchall()
    memory = json.dumps([r["content"] for r in saved])
    assert memory.count("ALPHA: db-2 too") == 1
    assert memory.count("BRAVO: and db-3") == 1
    assert len(stored(conn, run_id)) == 2
    # A deploy check replays the run against the code: its boundaries take where it took.
    checked = CliRunner().invoke(
        cli,
        ["deploy", "check", "--json"],
        env={
            "LEDGERLOOP_DATABASE_URL": db_url,
            "LEDGERLOOP_AGENT_MODULES": "tests.support.message_agents",
            "LEDGERLOOP_POLICY_FILE": str(REPO / "tests" / "support" / "policy.yaml"),
        },
    )
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.stdout)
    assert report["finished_sampled"] == 1
    assert report["finished_diverging"] == 0, report


def test_a_message_wakes_a_waiting_orchestration(
    conn: Conn, db_url: str, scripted_model: Any, make_token: MakeToken, tmp_path: Path
) -> None:
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=scripted_model(LOOP_SCRIPT).url,
        LEDGERLOOP_AGENT_MODULES="tests.support.message_agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
    )
    runner = make_token("runner", name="bo@example.com")
    with (
        ServerThread(create_app(db_url, agent_names={"listener"})) as server,
        Client(server.url, runner) as api,
    ):
        run_id = str(start_test_run(conn, "listener", "wait for me"))
        with worker_process(env, log=tmp_path / "worker.log"):
            # The first wait timed out; the second one is under way.
            wait_until(
                lambda: "message-wait-1" in journal_steps(conn, uuid.UUID(run_id)), timeout=60
            )
            assert run_require(conn, uuid.UUID(run_id)).status not in (
                RunStatus.SUCCEEDED,
                RunStatus.FAILED,
            )
            api.send_message(run_id, "go ahead", idempotency_key="go")
            run = wait_terminal(conn, uuid.UUID(run_id), timeout=60)
    assert run.status is RunStatus.SUCCEEDED, (tmp_path / "worker.log").read_text()
    assert run.state["text"] == "go ahead"
    assert run.state["sent_by"] == "bo@example.com"
    assert run.state["first_timed_out"] is True
    steps = journal_steps(conn, uuid.UUID(run_id))
    assert steps[:3] == ["memory-load", "message-wait-0", "DBOS.recv"], steps
    assert "message-wait-1-1" in steps


def test_runs_send_from_the_command_line(
    server: ServerThread, conn: Conn, make_token: MakeToken
) -> None:
    runner = make_token("runner")
    run_id = start_test_run(conn, "looper", "hello")
    env = {"LEDGERLOOP_URL": server.url, "LEDGERLOOP_TOKEN": runner}
    args = ["runs", "send", str(run_id), "check db-2 as well", "--key", "cli-1"]
    first = CliRunner().invoke(cli, args, env=env)
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(cli, args, env=env)
    assert again.exit_code == 0, again.output
    (row,) = stored(conn, run_id)
    assert f"message {row['id']} sent to run {run_id} (key cli-1)" in first.stdout
    assert first.stdout == again.stdout  # the same message
    refused = CliRunner().invoke(
        cli, ["runs", "send", str(run_id), "other text", "--key", "cli-1"], env=env
    )
    assert refused.exit_code == 2
    assert "different content" in refused.output
