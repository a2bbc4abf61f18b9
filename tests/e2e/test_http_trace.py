"""The HTTP start of a run is linked to the run's trace, and SQL can name that trace too."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from opentelemetry.trace import SpanKind, StatusCode

from ledgerloop.db.connect import Conn
from ledgerloop.http.app import create_app
from ledgerloop.telemetry.runtrace import root_context, traceparent
from ledgerloop.telemetry.spans import get_telemetry
from tests.e2e.conftest import AGENTS, MakeToken, ServerThread, bearer
from tests.support.telemetry import Captured

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_post_runs_is_a_server_span_in_the_callers_trace_linked_to_the_run(
    http: httpx.Client, make_token: MakeToken, captured: Captured
) -> None:
    response = http.post(
        "/v1/runs",
        json={"agent": "ops", "input": {"message": "db-1 disk full"}},
        headers={**bearer(make_token("runner")), "traceparent": CALLER},
    )
    assert response.status_code == 201, response.text
    run_id = uuid.UUID(response.json()["id"])
    (span,) = captured.by_kind("POST /v1/runs")
    assert span.kind is SpanKind.SERVER
    assert span.context.trace_id == int(CALLER.split("-")[1], 16)
    assert span.parent is not None
    assert span.parent.span_id == int(CALLER.split("-")[2], 16)
    (link,) = span.links
    assert link.context.trace_id == run_id.int
    assert link.context.span_id == root_context(run_id).span_id
    attrs = dict(span.attributes or {})
    assert attrs["ledgerloop.run.id"] == str(run_id)
    assert attrs["http.response.status_code"] == 201


def test_a_refused_start_is_an_error_span(
    http: httpx.Client, make_token: MakeToken, captured: Captured
) -> None:
    response = http.post(
        "/v1/runs",
        json={"agent": "ops", "input": {"message": "x"}},
        headers={**bearer(make_token("runner")), "Idempotency-Key": "k-1"},
    )
    assert response.status_code == 201
    again = http.post(
        "/v1/runs",
        json={"agent": "ops", "input": {"message": "different"}},
        headers={**bearer(make_token("runner")), "Idempotency-Key": "k-1"},
    )
    assert again.status_code == 422
    refused = captured.by_kind("POST /v1/runs")[-1]
    assert refused.status.status_code is StatusCode.ERROR
    assert dict(refused.attributes or {})["error.type"] == "IdempotencyKeyReused"


def test_sql_names_the_runs_root_span(conn: Conn) -> None:
    for run_id in (
        uuid.uuid4(),
        uuid.UUID(int=1),
        uuid.UUID("ffffffff-ffff-ffff-ffff-ffffffffffff"),
    ):
        row = conn.execute("SELECT ledgerloop.run_traceparent(%s) AS tp", (run_id,)).fetchone()
        assert row is not None
        assert row["tp"] == traceparent(root_context(run_id))


class _ServerSpans:
    """What a web framework's OpenTelemetry instrumentation does (opentelemetry-instrument's
    ASGI and FastAPI ones): a SERVER span per request, current while the app handles it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracer = get_telemetry().tracer
        name = f"{scope['method']} {scope['path']}"
        with tracer.start_as_current_span(name, kind=SpanKind.SERVER):
            await self.app(scope, receive, send)


def test_an_instrumented_server_makes_one_request_span_linked_to_the_run(
    db_url: str, make_token: MakeToken, captured: Captured
) -> None:
    app = create_app(db_url, agent_names=AGENTS)
    app.add_middleware(_ServerSpans)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        response = http.post(
            "/v1/runs",
            json={"agent": "ops", "input": {"message": "db-1 disk full"}},
            headers=bearer(make_token("runner")),
        )
    assert response.status_code == 201, response.text
    run_id = uuid.UUID(response.json()["id"])
    servers = [
        s
        for s in captured.spans.get_finished_spans()
        if s.kind is SpanKind.SERVER and s.name.startswith("POST")
    ]
    # One request, one SERVER span: the instrumentation's, not a second one in a trace of
    # its own.
    (span,) = servers
    (link,) = span.links
    assert link.context.trace_id == run_id.int
    assert link.context.span_id == root_context(run_id).span_id
    attrs = dict(span.attributes or {})
    assert attrs["ledgerloop.run.id"] == str(run_id)
    assert attrs["http.route"] == "/v1/runs"
    assert attrs["http.response.status_code"] == 201
