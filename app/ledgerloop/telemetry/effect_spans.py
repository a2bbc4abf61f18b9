"""Spans of an effect after its act step: the relay's delivery and the reconciler's settling.

Both join the run's trace under its root (the effect's request carries the traceparent of
the ``execute_tool`` span that recorded it) and link to that tool span: the tool span ends
when the act step does, while a delivery may come seconds or, after retries, minutes later.
The delivery is a CLIENT span whose context goes to the destination as ``traceparent``: an
HTTP header, or the request's ``_meta`` for an MCP ``tools/call``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind

from ledgerloop.telemetry import semconv as sc
from ledgerloop.telemetry.runtrace import (
    _start,
    new_span_id,
    parse_traceparent,
    root_span_id,
    traceparent,
)
from ledgerloop.telemetry.spans import Attrs, Telemetry, _set_error, get_telemetry
from ledgerloop.telemetry.tool_spans import McpCall

#: error.type of an effect's end that is not a success, by effect status.
EFFECT_ERRORS = {
    "failed": sc.ERROR_EFFECT_FAILED,
    "needs_human": sc.ERROR_EFFECT_NEEDS_HUMAN,
    "outcome_unknown": sc.ERROR_EFFECT_OUTCOME_UNKNOWN,
}


def _placement(tool_traceparent: str | None) -> tuple[SpanContext | None, int, list[Link]]:
    """Parent (the run's root), trace id and links for a span about an effect."""
    tool = parse_traceparent(tool_traceparent)
    if tool is None:
        return None, 0, []
    root = SpanContext(
        tool.trace_id,
        root_span_id(tool.trace_id),
        is_remote=True,
        trace_flags=tool.trace_flags,
    )
    return root, tool.trace_id, [Link(tool)]


def _record_outcome(span: Span, effect_status: str, detail: str, answer: str | None) -> None:
    """What an attempt meant for the effect; `answer` is the error.type the protocol's
    conventions give an error answer (an HTTP status, a JSON-RPC code), when there was one."""
    span.set_attribute(sc.LEDGERLOOP_EFFECT_STATUS, effect_status)
    if answer is None and effect_status in ("succeeded", "pending"):
        return
    _set_error(span, answer or EFFECT_ERRORS.get(effect_status, effect_status), detail)


class Delivery:
    """Handle for one delivery attempt's span."""

    def __init__(self, span: Span) -> None:
        self.span = span

    @property
    def headers(self) -> dict[str, str]:
        """Headers that carry this span's context to the destination."""
        ctx = self.span.get_span_context()
        return {"traceparent": traceparent(ctx)} if ctx.is_valid else {}

    def record(self, status_code: int | None, effect_status: str, detail: str) -> None:
        """The answer (if any) and what it means for the effect."""
        if status_code is not None:
            self.span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, status_code)
        # HTTP conventions: the status code for an error answer, else what it means.
        answer = str(status_code) if status_code is not None and status_code >= 400 else None
        _record_outcome(self.span, effect_status, detail, answer)


class McpDelivery:
    """Handle for one MCP delivery attempt's span."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def connected(self, session_id: str | None, protocol_version: str | None) -> None:
        """The session the call went over (known once connected)."""
        if session_id:
            self.span.set_attribute(sc.MCP_SESSION_ID, session_id)
        if protocol_version:
            self.span.set_attribute(sc.MCP_PROTOCOL_VERSION, protocol_version)

    def record(
        self, effect_status: str, detail: str, *, rpc_code: int | None, tool_error: bool
    ) -> None:
        """The answer and what it means for the effect. MCP conventions: error.type is the
        JSON-RPC code of an error answer, `tool_error` for a result with isError."""
        answer = None
        if rpc_code is not None:
            answer = str(rpc_code)
            self.span.set_attribute(sc.RPC_RESPONSE_STATUS_CODE, answer)
        elif tool_error:
            answer = sc.MCP_TOOL_ERROR
        _record_outcome(self.span, effect_status, detail, answer)


def _delivery_start(tel: Telemetry, name: str, attrs: Attrs, tool_traceparent: str | None) -> Span:
    """A delivery attempt's CLIENT span, placed under the run's root and linked to the tool
    span that recorded the effect (HTTP and MCP alike)."""
    parent, trace_id, links = _placement(tool_traceparent)
    if parent is None:  # an effect recorded without tracing: its own trace
        return tel.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attrs)
    return _start(
        tel,
        name,
        trace_id=trace_id,
        span_id=new_span_id(),
        parent=parent,
        kind=SpanKind.CLIENT,
        attributes=attrs,
        links=links,
    )


@contextmanager
def _ending(span: Span) -> Iterator[None]:
    try:
        yield
    except BaseException as exc:
        _set_error(span, type(exc).__name__, str(exc))
        raise
    finally:
        span.end()


def _current(span: Span) -> AbstractContextManager[Span]:
    # Errors are _ending's to record, once.
    return trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    )


@contextmanager
def delivery_span(
    method: str,
    url: str,
    *,
    idempotency_key: str,
    attempt: int,
    tool_traceparent: str | None,
    telemetry: Telemetry | None = None,
) -> Iterator[Delivery]:
    """``{METHOD}`` (CLIENT) around one delivery attempt to a destination."""
    parts = urlsplit(url)
    attrs: Attrs = {
        sc.HTTP_REQUEST_METHOD: method.upper(),
        sc.URL_FULL: url,
        sc.LEDGERLOOP_EFFECT_IDEMPOTENCY_KEY: idempotency_key,
        sc.LEDGERLOOP_EFFECT_ATTEMPT: attempt,
    }
    if parts.hostname:
        attrs[sc.SERVER_ADDRESS] = parts.hostname
        attrs[sc.SERVER_PORT] = parts.port or (443 if parts.scheme == "https" else 80)
    span = _delivery_start(telemetry or get_telemetry(), method.upper(), attrs, tool_traceparent)
    with _ending(span):
        yield Delivery(span)


@contextmanager
def mcp_delivery_span(
    tool: str,
    *,
    mcp: McpCall,
    idempotency_key: str,
    attempt: int,
    tool_traceparent: str | None,
    telemetry: Telemetry | None = None,
) -> Iterator[McpDelivery]:
    """``tools/call {tool}`` (CLIENT) around one MCP delivery attempt, current while it runs:
    the SDK injects the current context into the request's ``_meta``, so the server's span
    is this one's child (and ledgerloop.mcptools.spans merges the SDK's own client span into
    it). No gen_ai.operation.name: the tool's execution is its execute_tool span; this is one
    attempt to deliver its effect, of possibly several."""
    attrs: Attrs = {
        **mcp.attributes(),
        sc.GEN_AI_TOOL_NAME: tool,
        sc.LEDGERLOOP_EFFECT_IDEMPOTENCY_KEY: idempotency_key,
        sc.LEDGERLOOP_EFFECT_ATTEMPT: attempt,
    }
    name = f"{mcp.method_name} {tool}"
    span = _delivery_start(telemetry or get_telemetry(), name, attrs, tool_traceparent)
    with _ending(span), _current(span):
        yield McpDelivery(span)


def settled_span(
    tool_name: str,
    *,
    idempotency_key: str,
    status: str,
    reason: str,
    settled_by: str,
    tool_traceparent: str | None,
    started_ns: int | None = None,
    telemetry: Telemetry | None = None,
) -> None:
    """``reconcile_effect {tool}``: an effect's final outcome, settled after its delivery
    (by the reconciler or a person), so the outcome lands on the run's trace."""
    tel = telemetry or get_telemetry()
    parent, trace_id, links = _placement(tool_traceparent)
    if parent is None:
        return
    attrs: Attrs = {
        sc.GEN_AI_TOOL_NAME: tool_name,
        sc.LEDGERLOOP_EFFECT_IDEMPOTENCY_KEY: idempotency_key,
        sc.LEDGERLOOP_EFFECT_STATUS: status,
        sc.LEDGERLOOP_EFFECT_SETTLED_BY: settled_by,
    }
    now = time.time_ns()
    span = _start(
        tel,
        sc.reconcile_span_name(tool_name),
        trace_id=trace_id,
        span_id=new_span_id(),
        parent=parent,
        attributes=attrs,
        links=links,
        start_time=min(started_ns or now, now),
    )
    if status in EFFECT_ERRORS:
        _set_error(span, EFFECT_ERRORS[status], reason)
    span.end(end_time=now)
