"""Failures are marked where a user looks: ERROR status and `error.type` on the span, and the
same `error.type` on its duration metric. A failed model call, a failed tool, a refused
effect, an effect a person had to settle, and a failed run (in-memory exporters, in-process
worker with its relay and reconciler, the real ticket service)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from ledgerloop.db.connect import Conn
from ledgerloop.effects.ledger import effect_list, effect_resolve
from ledgerloop.examples.ticket_service import TicketServiceThread
from ledgerloop.runs.states import RunStatus
from ledgerloop.telemetry.content import CaptureMode
from ledgerloop.testing.postgres import wait_until
from tests.conftest import start_test_run, wait_terminal
from tests.support.telemetry import Captured, capture_telemetry


def _error_type(span: ReadableSpan) -> Any:
    assert span.status.status_code is StatusCode.ERROR, span.name
    return dict(span.attributes or {}).get("error.type")


def _points(captured: Captured, name: str) -> list[dict[str, Any]]:
    return [
        dict(point.attributes or {})
        for rm in captured.metrics.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def _of_run(captured: Captured, run_id: uuid.UUID) -> list[ReadableSpan]:
    return [
        s
        for s in captured.spans.get_finished_spans()
        if s.context is not None and s.context.trace_id == run_id.int
    ]


def test_failed_model_call_and_failed_run(
    conn: Conn, scripted_model: Any, worker: Any, captured: Captured
) -> None:
    model = scripted_model("default: {turns: [{status: 500, message: provider down}]}")
    worker(model.url)
    run_id = start_test_run(conn, "looper", "hello")
    assert wait_terminal(conn, run_id).status is RunStatus.FAILED
    spans = _of_run(captured, run_id)
    (chat,) = [s for s in spans if s.name.startswith("chat ")]
    assert _error_type(chat) == "InternalServerError"
    assert "provider down" in (chat.status.description or "")
    (duration,) = _points(captured, "gen_ai.client.operation.duration")
    assert duration["error.type"] == "InternalServerError"
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent looper"
    assert _error_type(root) == "model_call_failed"
    assert dict(root.attributes or {})["ledgerloop.run.status"] == "failed"
    (agent,) = _points(captured, "gen_ai.invoke_agent.duration")
    assert agent["error.type"] == "model_call_failed"


def test_failed_model_call_emits_its_details_event_when_content_is_captured(
    conn: Conn, scripted_model: Any, worker: Any
) -> None:
    model = scripted_model("default: {turns: [{status: 500, message: provider down}]}")
    for captured in capture_telemetry(CaptureMode.EVENT_ONLY):
        worker(model.url)
        run_id = start_test_run(conn, "looper", "the secret question")
        assert wait_terminal(conn, run_id).status is RunStatus.FAILED
        (chat,) = [s for s in _of_run(captured, run_id) if s.name.startswith("chat ")]
        assert _error_type(chat) == "InternalServerError"
        (event,) = [
            r.log_record
            for r in captured.logs.get_finished_logs()
            if r.log_record.event_name == "gen_ai.client.inference.operation.details"
        ]
        attrs = dict(event.attributes or {})
        assert attrs["error.type"] == "InternalServerError"
        assert attrs["gen_ai.request.max_tokens"] == 2048
        assert "the secret question" in str(attrs["gen_ai.input.messages"])
        assert "gen_ai.output.messages" not in attrs  # there was no answer
        assert event.span_id == chat.context.span_id


def test_every_execute_tool_span_has_a_description(
    conn: Conn, scripted_model: Any, worker: Any, captured: Captured
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: no_such_tool, input: {}}
            - tool_use: {name: echo, input: {text: hi}}
            - text: done
        """
    )
    worker(model.url)
    run_id = start_test_run(conn, "looper", "hello")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    tools = {
        s.name: dict(s.attributes or {})
        for s in _of_run(captured, run_id)
        if s.name.startswith("execute_tool")
    }
    assert tools["execute_tool echo"]["gen_ai.tool.description"] == "Echo the text back."
    unknown = tools["execute_tool no_such_tool"]
    assert unknown["gen_ai.tool.description"] == "unknown tool 'no_such_tool'"
    assert unknown["error.type"] == "UnknownTool"


def test_failed_tool(conn: Conn, scripted_model: Any, worker: Any, captured: Captured) -> None:
    model = scripted_model(
        "default: {turns: [{tool_use: {name: denied, input: {key: k1}}}, {text: gave up}]}"
    )
    worker(model.url)
    run_id = start_test_run(conn, "looper", "try it")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    (tool,) = [s for s in _of_run(captured, run_id) if s.name == "execute_tool denied"]
    assert _error_type(tool) == "PolicyDenied"
    (duration,) = _points(captured, "gen_ai.execute_tool.duration")
    assert duration["error.type"] == "PolicyDenied"


def test_refused_effect(
    conn: Conn, scripted_model: Any, worker: Any, captured: Captured, tickets: TicketServiceThread
) -> None:
    model = scripted_model(
        """
        default:
          turns:
            - tool_use: {name: ticket_plain, input: {title: x, priority: urgent}}
            - text: "could not file it"
        """
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    spans = _of_run(captured, run_id)
    # The delivery: a CLIENT span in the run's trace, with the HTTP status as error.type.
    (post,) = [s for s in spans if s.name == "POST"]
    assert post.kind is SpanKind.CLIENT
    assert _error_type(post) == "422"
    assert dict(post.attributes or {})["ledgerloop.effect.status"] == "failed"
    # The act step saw the refusal (within its watch) or the run's wait for it did.
    marked = [
        s
        for s in spans
        if s.name in ("execute_tool ticket_plain", "await_effect ticket_plain")
        and s.status.status_code is StatusCode.ERROR
    ]
    assert [_error_type(s) for s in marked] == ["effect_failed"]


def test_effect_settled_by_a_person_lands_on_the_trace(
    conn: Conn, scripted_model: Any, worker: Any, captured: Captured, tickets: TicketServiceThread
) -> None:
    httpx.post(
        f"{tickets.url}/_faults", json={"mode": "commit_then_drop", "kind": "plain"}
    ).raise_for_status()
    model = scripted_model(
        "default: {turns: [{tool_use: {name: ticket_plain, input: {title: x}}}, {text: ok}]}"
    )
    worker(model.url)
    run_id = start_test_run(conn, "writer", "file")

    def parked() -> Any:
        found = effect_list(conn, run_id=run_id, status="needs_human")
        return found[0] if found else None

    effect = wait_until(parked, timeout=20)
    effect_resolve(conn, effect.key, succeeded_ref="TCK-000001", operator="ops-oncall")
    assert wait_terminal(conn, run_id).status is RunStatus.SUCCEEDED
    spans = _of_run(captured, run_id)
    (post,) = [s for s in spans if s.name == "POST"]
    assert _error_type(post) == "effect_outcome_unknown"
    settled = [s for s in spans if s.name == "reconcile_effect ticket_plain"]
    by = {dict(s.attributes or {})["ledgerloop.effect.settled_by"]: s for s in settled}
    assert _error_type(by["reconciler"]) == "effect_needs_human"
    assert dict(by["operator"].attributes or {})["ledgerloop.effect.status"] == "succeeded"
    assert by["operator"].status.status_code is StatusCode.UNSET
    # Both settle the effect the act step recorded: linked to its execute_tool span.
    (tool,) = [s for s in spans if s.name == "execute_tool ticket_plain"]
    for span in (post, *settled):
        assert [link.context.span_id for link in span.links] == [tool.context.span_id]
