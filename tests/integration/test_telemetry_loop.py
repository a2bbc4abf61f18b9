"""The trace tree of a real run mirrors its journal (in-memory exporters, in-process worker)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.runs.states import RunStatus
from ledgerloop.telemetry.content import CaptureMode
from ledgerloop.telemetry.runtrace import root_span_id
from ledgerloop.testing.worker import WorkerThread
from tests.conftest import start_test_run, wait_terminal
from tests.support.telemetry import Captured, capture_telemetry

DEFAULT_TENANT_ID = str(DEFAULT_TENANT)

SCRIPT = """
default:
  turns:
    - tool_use: {name: search_kb, input: {query: "secret-runbook disk full"}}
    - text: "the secret answer"
"""


@pytest.fixture
def captured_with_content() -> Iterator[Captured]:
    yield from capture_telemetry(CaptureMode.EVENT_ONLY)


def _run(conn: Conn, make_settings: Any, db_url: str, model: Any) -> Any:
    with WorkerThread(make_settings(anthropic_base_url=model.url), db_url):
        run_id = start_test_run(conn, "ops", "secret question about db-1")
        run = wait_terminal(conn, run_id)
    assert run.status is RunStatus.SUCCEEDED
    return run_id


def test_two_turn_run_is_one_tree(
    conn: Conn, make_settings: Any, db_url: str, scripted_model: Any, captured: Captured
) -> None:
    model = scripted_model(SCRIPT)
    run_id = _run(conn, make_settings, db_url, model)
    (agent,) = captured.by_kind("invoke_agent")
    (execution,) = captured.by_kind("execution")
    chats = captured.by_kind("chat")
    (tool,) = captured.by_kind("execute_tool")
    assert agent.name == "invoke_agent ops"
    assert agent.kind is SpanKind.INTERNAL
    # The run's root: trace id = the run id, span id derived from it, no parent, emitted
    # whole when the run ended (from the run's creation), with the agent known at its start.
    assert agent.parent is None
    assert agent.context.trace_id == run_id.int
    assert agent.context.span_id == root_span_id(run_id.int)
    assert agent.status.status_code is StatusCode.UNSET
    root_attrs = dict(agent.attributes or {})
    assert root_attrs["gen_ai.agent.name"] == "ops"
    assert root_attrs["gen_ai.conversation.id"] == str(run_id)
    assert root_attrs["ledgerloop.tenant.id"] == DEFAULT_TENANT_ID
    assert root_attrs["ledgerloop.run.status"] == "succeeded"
    # The run's totals: every model call of the run (here both chats of its one execution).
    chat_attrs = [dict(c.attributes or {}) for c in captured.by_kind("chat")]
    for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        assert root_attrs[key] == sum(a[key] for a in chat_attrs) > 0
    assert agent.start_time is not None
    assert execution.start_time is not None
    assert agent.start_time <= execution.start_time
    assert execution.name == "execution ops"
    assert execution.parent is not None
    assert execution.parent.span_id == agent.context.span_id
    assert dict(execution.attributes or {})["ledgerloop.execution.end"] == "completed"
    assert len(chats) == 2
    assert all(c.kind is SpanKind.CLIENT for c in chats)
    assert tool.name == "execute_tool search_kb"
    assert tool.kind is SpanKind.INTERNAL
    for child in [*chats, tool]:
        assert child.parent is not None
        assert child.parent.span_id == execution.context.span_id
        assert child.context.trace_id == agent.context.trace_id
    attrs = dict(chats[0].attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "anthropic"
    assert attrs["gen_ai.request.model"] == "claude-haiku-4-5"
    assert attrs["gen_ai.response.model"] == "claude-haiku-4-5"
    assert attrs["gen_ai.response.finish_reasons"] == ("tool_call",)
    assert attrs["gen_ai.usage.output_tokens"] > 0
    assert str(attrs["gen_ai.response.id"]).startswith("msg_")
    assert attrs["server.address"] == "127.0.0.1"
    assert attrs["server.port"] == model.port
    assert attrs["ledgerloop.run.id"] == str(run_id)
    assert attrs["ledgerloop.step.name"] == "think-0"
    assert attrs["gen_ai.conversation.id"] == str(run_id)
    assert attrs["ledgerloop.tenant.id"] == DEFAULT_TENANT_ID
    tool_attrs = dict(tool.attributes or {})
    call_id = model.requests()[1]["request"]["messages"][1]["content"][0]["id"]
    assert tool_attrs["gen_ai.tool.name"] == "search_kb"
    assert tool_attrs["gen_ai.tool.call.id"] == call_id
    assert tool_attrs["gen_ai.tool.type"] == "function"
    # A read tool runs inside the next think step: the span names the step that ran it.
    assert tool_attrs["ledgerloop.step.name"] == "think-1"
    assert tool_attrs["gen_ai.tool.description"].startswith("Search")
    assert tool_attrs["ledgerloop.tenant.id"] == DEFAULT_TENANT_ID
    # Content stays off spans and no content event is emitted by default.
    for span in captured.spans.get_finished_spans():
        for value in (span.attributes or {}).values():
            assert "secret" not in str(value)
    assert captured.logs.get_finished_logs() == ()
    # Agent metrics were recorded for the invocation.
    names = {
        m.name
        for rm in captured.metrics.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {
        "gen_ai.client.operation.duration",
        "gen_ai.client.token.usage",
        "gen_ai.invoke_agent.duration",
        "gen_ai.invoke_agent.inference_calls",
        "gen_ai.invoke_agent.tool_calls",
        "gen_ai.execute_tool.duration",
    } <= names


def test_content_rides_an_event_when_opted_in(
    conn: Conn,
    make_settings: Any,
    db_url: str,
    scripted_model: Any,
    captured_with_content: Captured,
) -> None:
    model = scripted_model(SCRIPT)
    _run(conn, make_settings, db_url, model)
    events = [
        r
        for r in captured_with_content.logs.get_finished_logs()
        if r.log_record.event_name == "gen_ai.client.inference.operation.details"
    ]
    assert len(events) == 2
    body = str(dict(events[1].log_record.attributes or {}))
    assert "the secret answer" in body
    for span in captured_with_content.spans.get_finished_spans():
        for value in (span.attributes or {}).values():
            assert "secret" not in str(value)


def test_model_requests_carry_the_chat_spans_traceparent(
    conn: Conn, make_settings: Any, db_url: str, scripted_model: Any, captured: Captured
) -> None:
    model = scripted_model(SCRIPT)
    run_id = _run(conn, make_settings, db_url, model)
    chats = {c.context.span_id: c for c in captured.by_kind("chat")}
    sent = [r["headers"]["traceparent"] for r in model.requests()]
    assert len(sent) == 2
    for value in sent:
        _, trace_id, span_id, _flags = value.split("-")
        assert int(trace_id, 16) == run_id.int
        assert int(span_id, 16) in chats
