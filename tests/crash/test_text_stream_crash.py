"""Tokens as they are generated, across real processes: a worker streams its model call, an
HTTP process (another process's LISTEN) sends the text to a client as it arrives.

- The streamed text of each model call, concatenated, is the message the journal recorded.
- A worker SIGKILLed mid-stream while the client reads: a second worker runs the step again
  and the text comes again under the next attempt (the client discards the partial one),
  while every durable event reaches the client exactly once, in order, with no gap.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.approvals.principals import principal_create
from ledgerloop.approvals.store import approval_decide, approval_list
from ledgerloop.client import Client, Event
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.http.app import create_app
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, worker_env, worker_process
from tests.conftest import start_test_run, wait_terminal
from tests.e2e.conftest import ServerThread

pytestmark = pytest.mark.crash

LONG = " ".join(f"word{i}" for i in range(40)) + " done."

SCRIPT = """
default:
  turns:
    - text: "Let me echo that first, then answer."
      tool_use: {name: echo, input: {text: once}}
    - text: "The echo said once; all is well, and that is the whole answer."
"""

SLOW_SCRIPT = f"""
default:
  turns:
    - text: "{LONG}"
      delta_delay_ms: 150
"""


class Follower:
    """ledgerloop.client's events() in a thread; events land in a queue as they arrive."""

    def __init__(self, url: str, token: str, run_id: uuid.UUID) -> None:
        self.events: queue.Queue[Event | None] = queue.Queue()
        self.api = Client(url, token, retry_s=0.1)

        def main() -> None:
            try:
                for event in self.api.events(str(run_id)):
                    self.events.put(event)
            finally:
                self.events.put(None)

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()

    def seen(self, got: list[Event], done: Any, timeout: float = 90) -> list[Event]:
        """`until`, appending to `got` (what was seen before)."""
        got.extend(self.until(lambda new: done([*got, *new]), timeout))
        return got

    def until(self, done: Any, timeout: float = 90) -> list[Event]:
        got: list[Event] = []
        while True:
            event = self.events.get(timeout=timeout)
            if event is None:
                return got
            got.append(event)
            if done(got):
                return got


def _env(db_url: str, model_url: str, tmp_path: Path) -> dict[str, str]:
    return worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model_url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_TEST_TOOL_LOG=str(tmp_path / "tools.log"),
    )


def _token(conn: Conn) -> str:
    _, token = principal_create(
        conn, name=f"viewer-{uuid.uuid4()}@example.com", roles=("viewer",), tenant_id=DEFAULT_TENANT
    )
    return token


def _texts(events: list[Event]) -> dict[tuple[str, int], str]:
    """Each (step, attempt)'s streamed text, in the order it came; seq says none was lost."""
    texts: dict[tuple[str, int], str] = {}
    for event in events:
        if event.type == "text.delta":
            key = (event.data["step"], event.data["attempt"])
            texts[key] = texts.get(key, "") + event.data["text"]
    return texts


def _journaled_assistant_texts(conn: Conn, run_id: uuid.UUID) -> list[str]:
    rows = conn.execute(
        "SELECT m.value AS message FROM ledgerloop.agent_message_batch b, "
        "json_array_elements(b.messages) m WHERE b.run_id = %s ORDER BY b.first_sequence",
        (run_id,),
    ).fetchall()
    return [
        "".join(b.get("text", "") for b in row["message"]["content"] if b["type"] == "text")
        for row in rows
        if row["message"]["role"] == "assistant"
    ]


def test_streamed_text_is_the_journaled_message(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    token = _token(conn)
    with ServerThread(create_app(db_url, agent_names={"looper"})) as server:
        run_id = start_test_run(conn, "looper", "please echo")
        follower = Follower(server.url, token, run_id)
        cli_env = {**os.environ, "LEDGERLOOP_TOKEN": token, "LEDGERLOOP_URL": server.url}
        follow = subprocess.Popen(
            [sys.executable, "-m", "ledgerloop.cli", "runs", "follow", str(run_id)],
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with worker_process(_env(db_url, model.url, tmp_path), log=tmp_path / "w.log"):
            events = follower.until(lambda got: got[-1].type == "run.finished")
            run = wait_terminal(conn, run_id, timeout=60)
        printed, errors = follow.communicate(timeout=60)
    assert run.status.value == "succeeded", (tmp_path / "w.log").read_text()
    # The model server streamed: every request asked for it.
    assert all(r["request"]["stream"] is True for r in model.requests())
    texts = _texts(events)
    assert all(attempt == 1 for _, attempt in texts)
    assert list(texts.values()) == _journaled_assistant_texts(conn, run_id)
    assert list(texts.values())[-1] == run.state["answer"]
    # A delta is ephemeral: no id, so Last-Event-ID stays the durable sequence.
    assert all(e.id is None for e in events if e.type == "text.delta")
    ids = [e.id for e in events if e.id is not None]
    assert ids == list(range(len(ids)))
    # `ledgerloop runs follow`: the text as it came, steps and durable events as lines.
    assert follow.returncode == 0, errors
    lines = printed.splitlines()
    assert "Let me echo that first, then answer." in lines
    assert "#0 received" in lines
    assert any(line.startswith("#") and "step.finished (think-0)" in line for line in lines)
    assert "   step.started think-0 attempt 1" in lines
    assert "   tool.called think-1 attempt 1 echo" in lines
    assert lines[-3] == run.state["answer"]  # the text, then the line the answer's save made
    assert lines[-2].startswith("#")
    assert lines[-2].endswith(" succeeded (memory-save-1)")
    assert lines[-1] == f"run {run_id} finished: succeeded"


def test_worker_killed_mid_stream_client_sees_the_attempt_change(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(SLOW_SCRIPT)
    token = _token(conn)
    env = _env(db_url, model.url, tmp_path)
    with ServerThread(create_app(db_url, agent_names={"looper"})) as server:
        run_id = start_test_run(conn, "looper", "please write slowly")
        follower = Follower(server.url, token, run_id)
        with worker_process(env, log=tmp_path / "w1.log") as worker:

            def partial(got: list[Event]) -> bool:
                return sum(1 for e in got if e.type == "text.delta") >= 3

            seen = follower.until(partial)
            worker.kill()  # SIGKILL, mid-stream: the model is still writing
            assert worker.wait(timeout=30) == -9
        first = _texts(seen)
        assert list(first) == [("think-0", 1)]
        assert ("think-0", 1) in {
            (e.data["step"], e.data["attempt"]) for e in seen if e.type == "step.started"
        }
        assert LONG.startswith(first["think-0", 1])
        assert first["think-0", 1] != LONG
        with worker_process(env, log=tmp_path / "w2.log"):
            rest = follower.until(lambda got: got[-1].type == "run.finished")
            run = wait_terminal(conn, run_id, timeout=90)
    assert run.status.value == "succeeded", (tmp_path / "w2.log").read_text()
    events = seen + rest
    # The step ran again and said so: the whole text under attempt 2, the partial one before.
    texts = _texts(events)
    assert texts["think-0", 2] == LONG == run.state["answer"]
    attempts = [e.data["attempt"] for e in events if e.type == "text.delta"]
    assert attempts == sorted(attempts)
    restarted = [e for e in rest if e.type == "step.started" and e.data["step"] == "think-0"]
    assert [e.data["attempt"] for e in restarted] == [2]
    # Durable events: once each, in order, no gap: the recorded sequences themselves.
    ids = [e.id for e in events if e.id is not None]
    recorded = [
        row["sequence"]
        for row in conn.execute(
            "SELECT sequence FROM ledgerloop.agent_run_event WHERE run_id = %s ORDER BY 1",
            (run_id,),
        )
    ]
    assert ids == recorded == list(range(len(ids)))
    assert events[-1].type == "run.finished"
    assert events[-1].data["status"] == "succeeded"


OPS_SCRIPT = """
default:
  turns:
    - text: "Looking it up."
      tool_use: {name: search_kb, input: {query: "disk full"}}
    - tool_use: {name: write_ticket, input: {title: "db-1 disk full", priority: high}}
    - text: "Filed the ticket."
"""


def test_every_event_type_of_a_run_with_a_tool_an_approval_and_a_write(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(OPS_SCRIPT)
    token = _token(conn)
    approver, _ = principal_create(conn, name="alice", roles=["approver"])
    with (
        TicketServiceThread() as tickets,
        ServerThread(create_app(db_url, agent_names={"ops"})) as server,
    ):
        env = {
            **_env(db_url, model.url, tmp_path),
            "LEDGERLOOP_DESTINATIONS": json.dumps({"tickets": tickets.url}),
        }
        run_id = start_test_run(conn, "ops", "db-1 disk is full")
        follower = Follower(server.url, token, run_id)
        with worker_process(env, log=tmp_path / "w.log"):
            events = follower.until(lambda got: got[-1].type == "approval_requested")
            # A message to the run while it waits (the row POST /messages writes).
            conn.execute(
                "INSERT INTO ledgerloop.run_message "
                "(id, run_id, tenant_id, idempotency_key, content, sent_by) "
                "VALUES (%s, %s, %s, 'k1', '{\"text\": \"hurry\"}', 'bob')",
                (uuid.uuid4(), run_id, DEFAULT_TENANT),
            )
            events = follower.seen(events, lambda got: got[-1].type == "message.received")
            pending = wait_until(lambda: approval_list(conn, run_id=run_id, status="pending"))
            approval_decide(conn, approval_id=pending[0].id, principal=approver, decision="approve")
            events = follower.seen(events, lambda got: got[-1].type == "run.finished")
            run = wait_terminal(conn, run_id, timeout=60)
    assert run.status.value == "succeeded", (tmp_path / "w.log").read_text()
    types = {e.type for e in events}
    expected = {
        "received",  # the run started
        "step.started",
        "step.finished",
        "text.delta",
        "tool.called",
        "tool.result",
        "approval_requested",
        "approval.decided",
        "message.received",
        "succeeded",
        "run.finished",
    }
    assert expected <= types, expected - types
    by_type = {e.type: e for e in events}
    assert by_type["tool.called"].data["tool"] == "search_kb"
    assert by_type["tool.result"].data["is_error"] is False
    assert by_type["approval.decided"].data["payload"]["status"] == "approved"
    # The write tool's call: its status move recorded the effect's idempotency key.
    assert any(e.type == "executing" and e.payload.get("idempotency_key") for e in events)
    assert by_type["message.received"].data["payload"]["sent_by"] == "bob"
    steps = [e.data["payload"]["step"] for e in events if e.type == "step.finished"]
    assert "think-0" in steps
    assert all(not step.startswith("DBOS.") for step in steps)
    started = [(e.data["step"], e.data["attempt"]) for e in events if e.type == "step.started"]
    assert ("think-0", 1) in started
    # Durable ids: once each, in order, no gap, and the run's recorded events.
    ids = [e.id for e in events if e.id is not None]
    recorded = [
        row["sequence"]
        for row in conn.execute(
            "SELECT sequence FROM ledgerloop.agent_run_event WHERE run_id = %s ORDER BY 1",
            (run_id,),
        )
    ]
    assert ids == recorded == list(range(len(ids)))
