"""No second span for an MCP tool call: the SDK's client span merges into ours.

The `mcp` SDK (2.x) opens a CLIENT span `MCP send {method} {target}` for every request it
sends, with no option to turn it off or to hand it an outer span. The MCP conventions say an
instrumentation that knows an outer execute_tool span traces the call should add its
attributes there instead. So the SDK's tracer is replaced by one that, for tools/call, puts
the SDK's attributes (jsonrpc.request.id, error.type, rpc.response.status_code) and status on
the current span (a read's execute_tool span in its step; a write's `tools/call {tool}`
delivery span in the relay), and for every other request records nothing. The current span
stays current, so the trace context the SDK injects into `_meta` names it and the server's
span is its child.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from ledgerloop.mcptools.client import McpConnection
from ledgerloop.telemetry import McpCall
from ledgerloop.tools.policy import McpServer

_SDK_TOOL_CALL = "MCP send tools/call"


class _Merged(NonRecordingSpan):
    """The SDK's handle on its span: writes go to the execute_tool span; end() is ours."""

    def __init__(self, target: Span) -> None:
        super().__init__(target.get_span_context())
        self._target = target

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self._target.set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        self._target.set_attributes(attributes)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self._target.set_status(status, description)

    def is_recording(self) -> bool:
        return self._target.is_recording()


class MergingTracer(trace.Tracer):
    def start_span(self, name: str, *args: Any, **kwargs: Any) -> Span:
        return NonRecordingSpan(trace.get_current_span().get_span_context())

    @contextmanager
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Any = None,
        kind: Any = None,
        attributes: Mapping[str, AttributeValue] | None = None,
        links: Sequence[Any] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[Span]:
        current = trace.get_current_span()
        if name.startswith(_SDK_TOOL_CALL) and current.is_recording():
            merged = _Merged(current)
            if attributes:
                merged.set_attributes(attributes)
            yield merged
        else:
            yield NonRecordingSpan(current.get_span_context())


def merge_sdk_spans() -> None:
    """Install the merging tracer in the SDK (idempotent)."""
    from mcp.shared import _otel

    if not isinstance(_otel._tracer, MergingTracer):
        _otel._tracer = MergingTracer()


def call_facts(server: McpServer | None, connection: McpConnection | None = None) -> McpCall:
    """The MCP attributes of a tools/call to `server`: the transport's from its policy entry,
    the session's from `connection` (None: not connected yet, or it could not be)."""
    if server is None:
        return McpCall()
    address, port = (None, None)
    if server.url is not None:
        parts = urlsplit(server.url)
        address, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    http = server.transport == "streamable_http"
    return McpCall(
        session_id=connection.session_id if connection else None,
        protocol_version=connection.protocol_version if connection else None,
        network_transport="tcp" if http else "pipe",
        network_protocol_name="http" if http else None,
        server_address=address,
        server_port=port,
    )
