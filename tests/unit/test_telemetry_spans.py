"""The GenAI span tree: names, kinds, parentage, attributes, errors, MCP merge, links."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry._logs import NoOpLoggerProvider
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN_CONTEXT, NoOpTracerProvider, SpanKind, StatusCode

from ledgerloop.telemetry import semconv as sc
from ledgerloop.telemetry.content import CaptureMode
from ledgerloop.telemetry.spans import (
    Telemetry,
    agent_span,
    chat_span,
    get_telemetry,
    set_telemetry,
    span_context_from_dict,
    span_context_to_dict,
)
from ledgerloop.telemetry.tool_spans import McpCall, tool_span

RESPONSE: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6-20260101",
    "stop_reason": "tool_use",
    "content": [{"type": "tool_use", "id": "toolu_1", "name": "search_kb", "input": {"q": "x"}}],
    "usage": {
        "input_tokens": 100,
        "output_tokens": 20,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 50,
    },
}


@dataclass
class Traced:
    tel: Telemetry
    exporter: InMemorySpanExporter

    def spans(self) -> dict[str, ReadableSpan]:
        finished = self.exporter.get_finished_spans()
        by_name = {span.name: span for span in finished}
        assert len(by_name) == len(finished), "span names must be unique in these tests"
        return by_name


@pytest.fixture
def traced() -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = Telemetry(tracer_provider=provider, capture=CaptureMode.NO_CONTENT)
    set_telemetry(tel)  # the module default, so calls without telemetry= land here too
    yield Traced(tel, exporter)
    set_telemetry(None)
    provider.shutdown()


def run_one_turn(mcp: McpCall | None = None) -> None:
    with agent_span("ops-agent", "run-1", tenant_id="acme"):
        with chat_span(
            "claude-sonnet-4-6",
            server_address="api.anthropic.com",
            server_port=443,
            run_id="run-1",
            step_name="think-0",
            max_tokens=2048,
        ) as chat:
            chat.record_response(RESPONSE)
        with tool_span(
            "search_kb",
            "toolu_1",
            run_id="run-1",
            step_name="act-0-toolu_1",
            mcp=mcp,
            idempotency_key="run-1:toolu_1",
        ) as tool:
            tool.set_effect_status("committed")


def test_a_turn_is_one_tree_with_spec_names_and_kinds(traced: Traced) -> None:
    run_one_turn()
    spans = traced.spans()
    assert set(spans) == {
        "invoke_agent ops-agent",
        "chat claude-sonnet-4-6",
        "execute_tool search_kb",
    }
    agent = spans["invoke_agent ops-agent"]
    chat = spans["chat claude-sonnet-4-6"]
    tool = spans["execute_tool search_kb"]
    assert agent.kind is SpanKind.INTERNAL
    assert chat.kind is SpanKind.CLIENT
    assert tool.kind is SpanKind.INTERNAL
    assert agent.parent is None
    for child in (chat, tool):
        assert child.parent is not None
        assert child.parent.span_id == agent.context.span_id
        assert child.context.trace_id == agent.context.trace_id
    assert agent.instrumentation_scope is not None
    assert agent.instrumentation_scope.schema_url == sc.SCHEMA_URL
    for span in spans.values():
        assert span.status.status_code is StatusCode.UNSET


def test_required_attributes(traced: Traced) -> None:
    run_one_turn()
    spans = traced.spans()
    agent = dict(spans["invoke_agent ops-agent"].attributes or {})
    assert agent[sc.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert agent[sc.GEN_AI_AGENT_NAME] == "ops-agent"
    assert agent[sc.LEDGERLOOP_RUN_ID] == "run-1"
    assert agent[sc.LEDGERLOOP_TENANT_ID] == "acme"
    assert sc.GEN_AI_PROVIDER_NAME not in agent  # removed from invoke_agent.internal (#289)

    chat = dict(spans["chat claude-sonnet-4-6"].attributes or {})
    assert chat[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert chat[sc.GEN_AI_PROVIDER_NAME] == "anthropic"
    assert chat[sc.GEN_AI_REQUEST_MODEL] == "claude-sonnet-4-6"
    assert chat[sc.GEN_AI_REQUEST_MAX_TOKENS] == 2048
    assert chat[sc.SERVER_ADDRESS] == "api.anthropic.com"
    assert chat[sc.SERVER_PORT] == 443
    assert chat[sc.LEDGERLOOP_STEP_NAME] == "think-0"
    assert chat[sc.GEN_AI_RESPONSE_ID] == "msg_01"
    assert chat[sc.GEN_AI_RESPONSE_MODEL] == "claude-sonnet-4-6-20260101"

    tool = dict(spans["execute_tool search_kb"].attributes or {})
    assert tool[sc.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert tool[sc.GEN_AI_TOOL_NAME] == "search_kb"
    assert tool[sc.GEN_AI_TOOL_CALL_ID] == "toolu_1"
    assert tool[sc.GEN_AI_TOOL_TYPE] == "function"
    assert tool[sc.GEN_AI_AGENT_NAME] == "ops-agent"  # inherited from the enclosing agent
    assert tool[sc.LEDGERLOOP_EFFECT_IDEMPOTENCY_KEY] == "run-1:toolu_1"
    assert tool[sc.LEDGERLOOP_EFFECT_STATUS] == "committed"


def test_sampling_relevant_attributes_are_set_at_creation(traced: Traced) -> None:
    seen: dict[str, dict[str, Any]] = {}

    class Spy(SimpleSpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            seen[span.name] = dict(span.attributes)

    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(Spy(InMemorySpanExporter()))
    set_telemetry(Telemetry(tracer_provider=provider, capture=CaptureMode.NO_CONTENT))
    run_one_turn()
    provider.shutdown()
    assert seen["invoke_agent ops-agent"][sc.GEN_AI_AGENT_NAME] == "ops-agent"
    assert seen["chat claude-sonnet-4-6"][sc.GEN_AI_REQUEST_MODEL] == "claude-sonnet-4-6"
    assert seen["chat claude-sonnet-4-6"][sc.SERVER_PORT] == 443
    assert seen["execute_tool search_kb"][sc.GEN_AI_TOOL_TYPE] == "function"


@pytest.mark.parametrize(
    ("stop_reason", "expected"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_call"),
        ("refusal", "refusal"),
        ("pause_turn", "pause_turn"),
    ],
)
def test_finish_reason_mapping(traced: Traced, stop_reason: str, expected: str) -> None:
    with chat_span("m", server_address=None, server_port=None, run_id="r", step_name="s") as c:
        c.record_response({"stop_reason": stop_reason})
    (span,) = traced.exporter.get_finished_spans()
    assert tuple((span.attributes or {})[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == (expected,)


def test_usage_counts_cached_tokens_as_input(traced: Traced) -> None:
    run_one_turn()
    chat = dict(traced.spans()["chat claude-sonnet-4-6"].attributes or {})
    assert chat[sc.GEN_AI_USAGE_INPUT_TOKENS] == 100 + 1000 + 50
    assert chat[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 20
    assert chat[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 1000
    assert chat[sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] == 50
    agent = dict(traced.spans()["invoke_agent ops-agent"].attributes or {})
    assert agent[sc.GEN_AI_USAGE_INPUT_TOKENS] == 1150  # totals for this execution


def test_usage_without_cache_fields_and_without_counts(traced: Traced) -> None:
    with chat_span("a", server_address=None, server_port=None, run_id="r", step_name="s") as c:
        c.record_response({"usage": {"input_tokens": 7, "output_tokens": 3}})
    with chat_span("b", server_address=None, server_port=None, run_id="r", step_name="s") as c:
        c.record_response({"usage": {"output_tokens": 3}})
    spans = traced.spans()
    first = dict(spans["chat a"].attributes or {})
    assert first[sc.GEN_AI_USAGE_INPUT_TOKENS] == 7
    assert sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS not in first
    assert sc.GEN_AI_USAGE_INPUT_TOKENS not in dict(spans["chat b"].attributes or {})
    assert sc.SERVER_ADDRESS not in first


def test_exception_marks_error_with_class_name_and_propagates(traced: Traced) -> None:
    class UpstreamTimeout(Exception):
        pass

    with (
        pytest.raises(UpstreamTimeout),
        agent_span("ops-agent", "run-2"),
        tool_span("write_ticket", "toolu_9", run_id="run-2", step_name="act-9"),
    ):
        raise UpstreamTimeout("ticket service did not answer in 8 s")
    spans = traced.spans()
    for name in ("invoke_agent ops-agent", "execute_tool write_ticket"):
        span = spans[name]
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ticket service did not answer in 8 s"
        assert (span.attributes or {})[sc.ERROR_TYPE] == "UpstreamTimeout"


def test_chat_exception_marks_error(traced: Traced) -> None:
    with (
        pytest.raises(ConnectionError),
        chat_span("m", server_address="h", server_port=1, run_id="r", step_name="s"),
    ):
        raise ConnectionError("reset")
    (span,) = traced.exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})[sc.ERROR_TYPE] == "ConnectionError"


def test_tool_error_returned_to_model_is_a_failure(traced: Traced) -> None:
    with tool_span("write_ticket", "toolu_3", run_id="r", step_name="act") as tool:
        tool.record_error("PolicyDenied", "write_ticket needs an approval")
        tool.set_approval_id("appr-1")
    (span,) = traced.exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "write_ticket needs an approval"
    attrs = dict(span.attributes or {})
    assert attrs[sc.ERROR_TYPE] == "PolicyDenied"
    assert attrs[sc.LEDGERLOOP_APPROVAL_ID] == "appr-1"
    assert sc.GEN_AI_AGENT_NAME not in attrs  # no enclosing agent, none given


def test_mcp_attributes_ride_the_execute_tool_span(traced: Traced) -> None:
    mcp = McpCall(
        session_id="sess-1",
        protocol_version="2025-06-18",
        request_id=7,
        jsonrpc_version="2.0",
        network_transport="pipe",
    )
    run_one_turn(mcp=mcp)
    spans = traced.exporter.get_finished_spans()
    assert len(spans) == 3  # no separate MCP span
    tool = dict(traced.spans()["execute_tool search_kb"].attributes or {})
    assert tool[sc.MCP_METHOD_NAME] == "tools/call"
    assert tool[sc.MCP_SESSION_ID] == "sess-1"
    assert tool[sc.MCP_PROTOCOL_VERSION] == "2025-06-18"
    assert tool[sc.JSONRPC_REQUEST_ID] == "7"
    assert tool[sc.NETWORK_TRANSPORT] == "pipe"
    assert sc.JSONRPC_PROTOCOL_VERSION not in tool  # only when not 2.0
    assert tool[sc.GEN_AI_OPERATION_NAME] == "execute_tool"


def test_mcp_is_error_result(traced: Traced) -> None:
    with tool_span("get_weather", "c1", run_id="r", step_name="s", mcp=McpCall()) as tool:
        tool.record_error(sc.MCP_TOOL_ERROR, "city not found", rpc_status_code=-32602)
    (span,) = traced.exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert attrs[sc.ERROR_TYPE] == "tool_error"
    assert attrs[sc.RPC_RESPONSE_STATUS_CODE] == "-32602"


def test_resumed_run_links_to_its_earlier_execution(traced: Traced) -> None:
    with agent_span("ops-agent", "run-3") as first:
        persisted = span_context_to_dict(first.span_context)
    traced.exporter.clear()
    earlier = span_context_from_dict(persisted)
    with agent_span("ops-agent", "run-3", links=[earlier, INVALID_SPAN_CONTEXT]) as second:
        assert second.span_context.trace_id != earlier.trace_id
    (span,) = traced.exporter.get_finished_spans()
    assert [link.context.span_id for link in span.links] == [earlier.span_id]
    assert span.links[0].context.trace_id == earlier.trace_id


def test_span_context_dict_round_trip_and_errors() -> None:
    assert span_context_to_dict(INVALID_SPAN_CONTEXT) == {}
    assert span_context_from_dict({}) is INVALID_SPAN_CONTEXT
    data = {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}
    ctx = span_context_from_dict(data)
    assert ctx.is_remote
    assert ctx.trace_flags.sampled
    assert span_context_to_dict(ctx) == {**data, "trace_flags": "01"}
    for bad in (
        {"trace_id": "zz", "span_id": "1"},
        {"span_id": "1"},
        {"trace_id": "0", "span_id": "0"},
    ):
        with pytest.raises(ValueError, match="span context"):
            span_context_from_dict(bad)


def test_replayed_steps_emit_nothing(traced: Traced) -> None:
    # The loop opens no chat/tool span for a journal hit; the agent span alone is recorded.
    with agent_span("ops-agent", "run-4") as inv:
        pass
    assert (inv.inference_calls, inv.tool_calls) == (0, 0)
    assert [s.name for s in traced.exporter.get_finished_spans()] == ["invoke_agent ops-agent"]


def test_without_an_sdk_everything_is_a_cheap_no_op() -> None:
    # What a process gets when configure_telemetry found nothing to export to.
    tel = Telemetry(
        tracer_provider=NoOpTracerProvider(),
        meter_provider=NoOpMeterProvider(),
        logger_provider=NoOpLoggerProvider(),
        capture=CaptureMode.EVENT_ONLY,
    )
    with agent_span("a", "r", telemetry=tel) as inv:
        with chat_span(
            "m", server_address=None, server_port=None, run_id="r", step_name="s", telemetry=tel
        ) as chat:
            chat.record_response(RESPONSE)
            chat.record_content([{"role": "user", "content": "hi"}], RESPONSE)
        with tool_span("t", "c", run_id="r", step_name="s", telemetry=tel):
            pass
    assert not inv.span_context.is_valid
    assert span_context_to_dict(inv.span_context) == {}
    assert (inv.inference_calls, inv.tool_calls) == (1, 1)


def test_default_telemetry_is_built_once() -> None:
    set_telemetry(None)
    try:
        assert get_telemetry() is get_telemetry()
    finally:
        set_telemetry(None)
