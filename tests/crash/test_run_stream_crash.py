"""SIGKILL the worker mid-run while a client reads the run's event stream over real HTTP.

The client's first connection drops with the worker's death; it reconnects with
Last-Event-ID while a second worker finishes the run. Every durable event reaches it
exactly once, in order, with no gap, and the stream ends with the run's final status.
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledgerloop.approvals.principals import principal_create
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.http.app import create_app
from ledgerloop.testing.processes import REPO, worker_env, worker_process
from tests.conftest import start_test_run, wait_terminal
from tests.e2e.conftest import ServerThread

pytestmark = pytest.mark.crash

SCRIPT = """
default:
  turns:
    - tool_use: {name: echo, input: {text: once}}
    - text: finished
"""

Event = tuple[int | None, str, dict[str, Any]]


class StreamReader:
    """One SSE connection read in a thread; events land in `events` as they arrive, and
    None when the connection ends (closed by the server, or dropped)."""

    def __init__(self, url: str, token: str, last_event_id: int | None = None) -> None:
        self.events: queue.Queue[Event | None] = queue.Queue()
        headers = {"Authorization": f"Bearer {token}"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        self.client = httpx.Client(timeout=httpx.Timeout(30, read=None))
        self.thread = threading.Thread(target=self._main, args=(url, headers), daemon=True)
        self.thread.start()

    def _main(self, url: str, headers: dict[str, str]) -> None:
        fields: dict[str, str] = {}
        try:
            with self.client.stream("GET", url, headers=headers) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if line == "" and "event" in fields:
                        ident = int(fields["id"]) if "id" in fields else None
                        self.events.put((ident, fields["event"], json.loads(fields["data"])))
                        fields = {}
                    elif line and not line.startswith(":"):
                        name, _, value = line.partition(": ")
                        fields[name] = value
        except (httpx.HTTPError, RuntimeError):
            pass  # the connection was dropped: the caller reconnects
        finally:
            self.events.put(None)

    def drop(self) -> None:
        self.client.close()
        self.thread.join(10)

    def received(self) -> list[Event]:
        got: list[Event] = []
        while True:
            try:
                item = self.events.get_nowait()
            except queue.Empty:
                return got
            if item is not None:
                got.append(item)

    def until_finished(self, timeout: float = 90) -> list[Event]:
        got: list[Event] = []
        while True:
            item = self.events.get(timeout=timeout)
            if item is None:
                return got
            got.append(item)


def test_reconnecting_client_sees_every_durable_event_once_in_order(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="tests.support.agents",
        LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
        LEDGERLOOP_TEST_TOOL_LOG=str(tmp_path / "tools.log"),
    )
    _, token = principal_create(
        conn, name="viewer@example.com", roles=("viewer",), tenant_id=DEFAULT_TENANT
    )
    with ServerThread(create_app(db_url, agent_names={"looper"})) as server:
        run_id = start_test_run(conn, "looper", "please echo")
        url = f"{server.url}/v1/runs/{run_id}/events"
        first = StreamReader(url, token)
        with worker_process(
            {**env, "LEDGERLOOP_FAULTS": "loop.after_think"}, log=tmp_path / "w1.log"
        ) as worker:
            assert worker.wait(timeout=60) == -9, (tmp_path / "w1.log").read_text()
        # The worker died mid-run; the client's connection drops too.
        seen = first.received()
        first.drop()
        seen += first.received()
        assert seen, "the first connection saw nothing before the worker died"
        assert all(event[1] != "run.finished" for event in seen)
        last = max(e[0] for e in seen if e[0] is not None)

        second = StreamReader(url, token, last_event_id=last)
        with worker_process(env, log=tmp_path / "w2.log"):
            run = wait_terminal(conn, run_id, timeout=90)
            rest = second.until_finished()
        second.drop()
    assert run.status.value == "succeeded", (tmp_path / "w2.log").read_text()

    ids = [e[0] for e in seen + rest if e[0] is not None]
    recorded = [
        row["sequence"]
        for row in conn.execute(
            "SELECT sequence FROM ledgerloop.agent_run_event WHERE run_id = %s ORDER BY 1",
            (run_id,),
        )
    ]
    # Exactly once, in order, no gap: the recorded sequences themselves.
    assert ids == recorded
    assert ids == list(range(len(ids)))
    assert rest[-1][1] == "run.finished"
    assert rest[-1][2]["status"] == "succeeded"
    assert rest[-1][2]["last"] == recorded[-1]
