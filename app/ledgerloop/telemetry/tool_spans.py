"""``execute_tool {tool}`` spans: one per tool execution, MCP attributes merged in.

Open one only when the tool body really runs: never for an act step answered from the
journal on replay. See ``ledgerloop.telemetry.spans`` for the shared plumbing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from ledgerloop.telemetry import semconv as sc
from ledgerloop.telemetry.runtrace import forcing_ids
from ledgerloop.telemetry.spans import (
    Attrs,
    Telemetry,
    _current_agent,
    _elapsed_s,
    _exception_type,
    _set_error,
    get_telemetry,
)


@dataclass(frozen=True, slots=True)
class McpCall:
    """MCP facts about a tool call, merged onto its ``execute_tool`` span.

    The MCP conventions say an instrumentation that knows an outer execute_tool span exists
    should add its attributes there instead of opening a second span; we are that outer span.
    """

    method_name: str = sc.MCP_METHOD_TOOLS_CALL
    session_id: str | None = None
    protocol_version: str | None = None
    request_id: str | int | None = None
    jsonrpc_version: str | None = None
    network_transport: str | None = None
    network_protocol_name: str | None = None
    network_protocol_version: str | None = None
    server_address: str | None = None
    server_port: int | None = None

    def attributes(self) -> Attrs:
        attrs: Attrs = {sc.MCP_METHOD_NAME: self.method_name}
        optional: dict[str, str | int | None] = {
            sc.MCP_SESSION_ID: self.session_id,
            sc.MCP_PROTOCOL_VERSION: self.protocol_version,
            # A string on the wire attribute; absent when the id is null.
            sc.JSONRPC_REQUEST_ID: None if self.request_id is None else str(self.request_id),
            # Only when not the default 2.0, per the MCP conventions.
            sc.JSONRPC_PROTOCOL_VERSION: None
            if self.jsonrpc_version in (None, "2.0")
            else self.jsonrpc_version,
            sc.NETWORK_TRANSPORT: self.network_transport,
            sc.NETWORK_PROTOCOL_NAME: self.network_protocol_name,
            sc.NETWORK_PROTOCOL_VERSION: self.network_protocol_version,
            sc.SERVER_ADDRESS: self.server_address,
            sc.SERVER_PORT: self.server_port if self.server_address else None,
        }
        attrs.update({key: value for key, value in optional.items() if value is not None})
        return attrs


class ToolRecorder:
    """Handle for one ``execute_tool`` span."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.error_type: str | None = None

    def set_effect_status(self, status: str) -> None:
        """The effect ledger's status for this call (e.g. ``committed``, ``unknown``)."""
        self.span.set_attribute(sc.LEDGERLOOP_EFFECT_STATUS, status)

    def set_approval_id(self, approval_id: str) -> None:
        self.span.set_attribute(sc.LEDGERLOOP_APPROVAL_ID, approval_id)

    def record_error(
        self, error_type: str, message: str, *, rpc_status_code: str | int | None = None
    ) -> None:
        """The tool failed without raising (e.g. a result sent back to the model as
        ``is_error``). Marks the span ERROR; use ``semconv.MCP_TOOL_ERROR`` for an MCP
        ``isError`` result and pass a JSON-RPC error code as ``rpc_status_code``.
        """
        self.error_type = error_type
        _set_error(self.span, error_type, message)
        if rpc_status_code is not None:
            self.span.set_attribute(sc.RPC_RESPONSE_STATUS_CODE, str(rpc_status_code))


@contextmanager
def tool_span(
    tool_name: str,
    call_id: str,
    *,
    run_id: str,
    step_name: str,
    tool_type: str = sc.TOOL_TYPE_FUNCTION,
    agent_name: str | None = None,
    mcp: McpCall | None = None,
    idempotency_key: str | None = None,
    description: str | None = None,
    telemetry: Telemetry | None = None,
    planned: tuple[int, int] | None = None,
) -> Iterator[ToolRecorder]:
    """Open ``execute_tool {tool_name}`` (INTERNAL) around one tool execution.

    Open it only when the tool body really runs: never for an act step answered from the
    journal on replay. ``agent_name`` defaults to the enclosing ``agent_span``'s. With ``mcp``
    the MCP attributes go on this span and no second span is made; the kind stays INTERNAL
    (the conventions do not say which kind a merged span keeps). Records
    ``gen_ai.execute_tool.duration`` on exit. ``planned``: the (trace id, span id) the
    span takes, when its traceparent was handed out before it started (runtrace.planned_span).
    """
    tel = telemetry or get_telemetry()
    invocation = _current_agent.get()
    if agent_name is None and invocation is not None:
        agent_name = invocation.agent_name or None
    attrs: Attrs = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_EXECUTE_TOOL,
        sc.GEN_AI_TOOL_NAME: tool_name,
        sc.GEN_AI_TOOL_TYPE: tool_type,
        sc.GEN_AI_TOOL_CALL_ID: call_id,
        sc.LEDGERLOOP_RUN_ID: run_id,
        sc.LEDGERLOOP_STEP_NAME: step_name,
    }
    if agent_name:
        attrs[sc.GEN_AI_AGENT_NAME] = agent_name
    if description:
        attrs[sc.GEN_AI_TOOL_DESCRIPTION] = description
    if invocation is not None:
        if invocation.conversation_id:
            attrs[sc.GEN_AI_CONVERSATION_ID] = invocation.conversation_id
        if invocation.tenant_id:
            attrs[sc.LEDGERLOOP_TENANT_ID] = invocation.tenant_id
    if idempotency_key:
        attrs[sc.LEDGERLOOP_EFFECT_IDEMPOTENCY_KEY] = idempotency_key
    if mcp is not None:
        attrs.update(mcp.attributes())
    if invocation is not None:
        invocation.tool_calls += 1
    start_ns = time.time_ns()
    with forcing_ids(tel, *planned) if planned else nullcontext():
        span = tel.tracer.start_span(
            sc.tool_span_name(tool_name),
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            start_time=start_ns,
        )
    recorder = ToolRecorder(span)
    try:
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield recorder
    except BaseException as exc:
        recorder.error_type = _exception_type(exc)
        _set_error(span, recorder.error_type, str(exc))
        raise
    finally:
        end_ns = time.time_ns()
        metric_attrs: Attrs = {sc.GEN_AI_TOOL_NAME: tool_name, sc.GEN_AI_TOOL_TYPE: tool_type}
        if agent_name:
            metric_attrs[sc.GEN_AI_AGENT_NAME] = agent_name
        if recorder.error_type:
            metric_attrs[sc.ERROR_TYPE] = recorder.error_type
        tel.instruments.execute_tool_duration.record(_elapsed_s(start_ns, end_ns), metric_attrs)
        span.end(end_time=end_ns)
