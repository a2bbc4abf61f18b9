"""GET /v1/runs/{id}/events over real HTTP (uvicorn) against a real Postgres, read by a real
SSE client: replay, live events through the LISTEN fan-out, resume, auth and bad input."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ledgerloop.client import ApiError, AsyncClient, Client
from ledgerloop.client import Event as ClientEvent
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.http.app import create_app
from ledgerloop.http.server import listen
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import Run, run_require, run_transition
from ledgerloop.testing.postgres import wait_until
from tests.e2e.conftest import (
    TENANT_B,
    MakeToken,
    ServerThread,
    bearer,
    run_awaiting_approval,
)

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Sse:
    id: int | None
    type: str
    data: dict[str, Any]


def sse_events(response: httpx.Response) -> Iterator[Sse]:
    """Parse a text/event-stream body as it arrives (comments skipped)."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if "event" in fields:
                ident = int(fields["id"]) if fields.get("id") else None
                yield Sse(ident, fields["event"], json.loads(fields["data"]))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value


class Reader:
    """A subscriber in a thread of its own: events land in a queue as they arrive."""

    def __init__(self, http: httpx.Client, path: str, headers: dict[str, str]) -> None:
        self.events: queue.Queue[Sse | None] = queue.Queue()
        self.status = 0

        def main() -> None:
            with http.stream("GET", path, headers=headers) as response:
                self.status = response.status_code
                for event in sse_events(response):
                    self.events.put(event)
            self.events.put(None)  # the stream closed

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()

    def next(self, timeout: float = 10) -> Sse | None:
        return self.events.get(timeout=timeout)


def new_run(conn: Conn, tenant: uuid.UUID = DEFAULT_TENANT) -> Run:
    run_id = start_run(conn, agent="ops", input={"message": "db-1 disk full"}, tenant_id=tenant)
    return run_require(conn, run_id)


def test_replay_then_live_then_finished(
    http: httpx.Client, conn: Conn, make_token: MakeToken
) -> None:
    token = make_token("viewer")
    run = new_run(conn)
    reader = Reader(http, f"/v1/runs/{run.id}/events", bearer(token))
    first = reader.next()
    assert first is not None
    assert reader.status == 200
    assert (first.id, first.type, first.data["payload"]) == (0, "received", {"agent": "ops"})
    assert reader.events.empty()  # the run is idle: nothing more, the stream stays open

    # Each move is announced by the trigger, read once by the hub and sent live.
    started = time.monotonic()
    run = run_transition(conn, run, RunStatus.PLANNING, "planning", {"turn": 0}).run
    live = reader.next()
    assert live is not None
    assert (live.id, live.type) == (1, "planning")
    assert time.monotonic() - started < 2
    run_transition(conn, run, RunStatus.FAILED, "failed", {"reason": "test"})
    failed = reader.next()
    assert failed is not None
    assert (failed.id, failed.type) == (2, "failed")
    end = reader.next()
    assert end is not None
    assert end.type == "run.finished"
    assert end.id is None
    assert end.data == {"run_id": str(run.id), "status": "failed", "last": 2}
    assert reader.next() is None  # closed after run.finished


def test_finished_run_replays_and_closes_and_resumes(
    http: httpx.Client, conn: Conn, make_token: MakeToken
) -> None:
    token = make_token("viewer")
    run = new_run(conn)
    run = run_transition(conn, run, RunStatus.PLANNING, "planning", {"turn": 0}).run
    run = run_transition(conn, run, RunStatus.EXECUTING, "executing", {"call": "c1"}).run
    run_transition(conn, run, RunStatus.SUCCEEDED, "succeeded", {})
    path = f"/v1/runs/{run.id}/events"

    def read(headers: dict[str, str], params: dict[str, str] | None = None) -> list[Sse]:
        with http.stream("GET", path, headers=headers, params=params) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            return list(sse_events(response))

    whole = read(bearer(token))
    assert [(e.id, e.type) for e in whole] == [
        (0, "received"),
        (1, "planning"),
        (2, "executing"),
        (3, "succeeded"),
        (None, "run.finished"),
    ]
    assert whole[-1].data["status"] == "succeeded"
    resumed = read({**bearer(token), "Last-Event-ID": "1"})
    assert [e.id for e in resumed] == [2, 3, None]
    assert [e.id for e in read(bearer(token), {"after": "2"})] == [3, None]
    # The header wins over the query (EventSource sends the header on its own reconnects).
    assert [e.id for e in read({**bearer(token), "Last-Event-ID": "3"}, {"after": "0"})] == [None]


def test_auth_tenants_and_bad_resume_points(
    http: httpx.Client, conn: Conn, make_token: MakeToken
) -> None:
    token = make_token("viewer")
    run = new_run(conn)
    path = f"/v1/runs/{run.id}/events"

    assert http.get(path).status_code == 401
    assert http.get(path, headers={"Authorization": "Bearer llt_garbage"}).status_code == 401
    other = make_token("viewer", "runner", tenant=TENANT_B)
    for who, where in ((other, path), (token, f"/v1/runs/{uuid.uuid4()}/events")):
        response = http.get(where, headers=bearer(who))
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "run_not_found"
    for bad, reason in (("abc", "is not an event id"), ("7", "is in the future")):
        response = http.get(path, headers={**bearer(token), "Last-Event-ID": bad})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert reason in error["message"]
        assert error["fix"]
    response = http.get(path, headers=bearer(token), params={"after": "1.5"})
    assert response.status_code == 400
    assert "after '1.5'" in response.json()["error"]["message"]


def _connections(conn: Conn, application_name: str) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = %s",
        (application_name,),
    ).fetchone()
    assert row is not None
    return int(row["n"])


def test_many_subscribers_share_one_listener_and_one_read(
    server: ServerThread, conn: Conn, make_token: MakeToken
) -> None:
    token = make_token("viewer")
    runs = [new_run(conn) for _ in range(5)]
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    with httpx.Client(base_url=server.url, timeout=30, limits=limits) as http:
        # The listener and the pool's connection exist once the first stream is served.
        warm = Reader(http, f"/v1/runs/{runs[0].id}/events", bearer(token))
        assert warm.next() is not None
        readers = [
            Reader(http, f"/v1/runs/{runs[i % 5].id}/events", bearer(token)) for i in range(100)
        ]
        for reader in readers:
            first = reader.next()
            assert first is not None
            assert first.id == 0
        hub = server.app.state.hub
        # Each subscribes to the hub right after its replay.
        wait_until(lambda: hub.subscribers == 101, timeout=10)
        # One LISTEN connection for the process, and the API's pool grown by at most the
        # stream reads allowed at once (READS_AT_ONCE): never one per subscriber.
        assert _connections(conn, "ledgerloop-stream-listen") == 1
        assert _connections(conn, "ledgerloop-http") <= 1 + 2
        reads = hub.reads
        for run in runs:
            run_transition(conn, run, RunStatus.FAILED, "failed", {"reason": "done"})
        for reader in [warm, *readers]:
            got = reader.next()
            assert got is not None
            assert (got.id, got.type) == (1, "failed")
            end = reader.next()
            assert end is not None
            assert end.type == "run.finished"
        # One read per run per notification, whatever the number of subscribers.
        assert hub.reads - reads <= 2 * len(runs)
        for reader in [warm, *readers]:
            reader.thread.join(10)
        assert hub.subscribers == 0


# -- the Python client and `ledgerloop runs follow` ------------------------------------------


def _server_on(url: str, db_url: str) -> ServerThread:
    """A new server on the address another one used (a restart of the API)."""
    server = ServerThread(create_app(db_url, agent_names={"ops"}))
    server.sock.close()
    server.sock = listen("127.0.0.1", int(url.rsplit(":", 1)[1]))
    server.url = url
    return server


def test_client_resumes_across_a_server_restart(
    db_url: str, conn: Conn, make_token: MakeToken
) -> None:
    token = make_token("runner")
    first = ServerThread(create_app(db_url, agent_names={"ops"})).__enter__()
    with Client(first.url, token, retry_s=0.1) as api:
        run_id = api.start_run("ops", {"message": "db-1 disk full"}, idempotency_key="k1")["id"]
        # The same key: the same run.
        assert (
            api.start_run("ops", {"message": "db-1 disk full"}, idempotency_key="k1")["id"]
            == run_id
        )
        run = run_transition(
            conn, run_require(conn, uuid.UUID(run_id)), RunStatus.PLANNING, "planning", {}
        ).run
        seen: queue.Queue[ClientEvent] = queue.Queue()

        def follow() -> None:
            for event in api.events(run_id):
                seen.put(event)

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert [seen.get(timeout=10).id for _ in range(2)] == [0, 1]
        first.__exit__(None, None, None)  # the API goes away mid-stream
        with _server_on(first.url, db_url):
            run_transition(conn, run, RunStatus.FAILED, "failed", {"reason": "done"})
            reader.join(30)
            assert not reader.is_alive()
    rest = [seen.get_nowait() for _ in range(seen.qsize())]
    assert [(e.id, e.type) for e in rest] == [(2, "failed"), (None, "run.finished")]


def test_async_client_replays_and_approves(
    http: httpx.Client, server: ServerThread, conn: Conn, make_token: MakeToken
) -> None:
    approval = run_awaiting_approval(conn)
    token = make_token("approver")

    async def main() -> tuple[list[ClientEvent], dict[str, object]]:
        async with AsyncClient(server.url, token) as api:
            decided = await api.approve(str(approval.id), "looks right")
            # Only the recorded part: the run waits for a worker that is not there.
            got: list[ClientEvent] = []
            async for event in api.events(str(approval.run_id), after=0):
                got.append(event)
                if event.id == 2:
                    break
            with pytest.raises(ApiError) as missing:
                async for _ in api.events(str(uuid.uuid4())):
                    pass
            assert missing.value.status == 404
            assert missing.value.type == "run_not_found"
            return got, decided

    got, decided = asyncio.run(main())
    assert [(e.id, e.type) for e in got] == [(1, "planning"), (2, "awaiting_approval")]
    assert decided["outcome"] == "applied"
    assert decided["approval"]["status"] == "approved"  # type: ignore[index]


def test_runs_follow_prints_steps_and_exits_with_the_outcome(
    server: ServerThread, conn: Conn, make_token: MakeToken
) -> None:
    token = make_token("viewer")
    run = new_run(conn)
    run = run_transition(conn, run, RunStatus.PLANNING, "planning", {"turn": 0}).run
    run_transition(conn, run, RunStatus.FAILED, "failed", {"reason": "test"})
    env = {**os.environ, "LEDGERLOOP_TOKEN": token, "LEDGERLOOP_URL": server.url}
    done = subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", "runs", "follow", str(run.id)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == [
        "#0 received",
        "#1 planning",
        "#2 failed",
        f"run {run.id} finished: failed",
    ]
    missing = subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", "runs", "follow", str(uuid.uuid4())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2
    assert "404 run_not_found" in missing.stderr
