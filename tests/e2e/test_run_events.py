"""GET /v1/runs/{id}/events over real HTTP (uvicorn) against a real Postgres, read by a real
SSE client: replay, live events through the LISTEN fan-out, resume, auth and bad input."""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import Run, run_require, run_transition
from ledgerloop.testing.postgres import wait_until
from tests.e2e.conftest import TENANT_B, MakeToken, ServerThread, bearer

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
