"""GenAI telemetry for Ledgerloop: spans, metrics and opt-in content events.

Names live in ``semconv``; the span API in ``spans`` and ``tool_spans``; a run's one trace
(root, executions, waits) in ``runtrace`` and ``executions``; an effect's delivery and settling
in ``effect_spans``; provider setup in ``setup``. See docs/observability.md.
"""

from ledgerloop.telemetry.content import CaptureMode
from ledgerloop.telemetry.semconv import SCHEMA_URL
from ledgerloop.telemetry.setup import configure_telemetry
from ledgerloop.telemetry.spans import (
    AgentInvocation,
    ChatRecorder,
    Telemetry,
    agent_span,
    chat_span,
    empty_turn,
    get_telemetry,
    mark_hibernated,
    run_swept,
    set_telemetry,
    span_context_from_dict,
    span_context_to_dict,
)
from ledgerloop.telemetry.tool_spans import McpCall, ToolRecorder, tool_span

__all__ = [
    "SCHEMA_URL",
    "AgentInvocation",
    "CaptureMode",
    "ChatRecorder",
    "McpCall",
    "Telemetry",
    "ToolRecorder",
    "agent_span",
    "chat_span",
    "configure_telemetry",
    "empty_turn",
    "get_telemetry",
    "mark_hibernated",
    "run_swept",
    "set_telemetry",
    "span_context_from_dict",
    "span_context_to_dict",
    "tool_span",
]
