"""Message content: the opt-in switch and the Anthropic -> GenAI message conversion.

Content (prompts, completions, tool arguments and results) is off by default. Message text on
span attributes is a privacy hazard: spans are sampled, batched and shipped to backends that
many people can read, and nobody expects a trace search to return customer data. So Ledgerloop
never puts content on a span, in any mode. When the operator opts in, the conversation rides
one ``gen_ai.client.inference.operation.details`` event per model call (a log record correlated
to the chat span), which can be routed to a separate, access-controlled store.

``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` accepts the values of
opentelemetry-util-genai (``NO_CONTENT``, ``SPAN_ONLY``, ``EVENT_ONLY``, ``SPAN_AND_EVENT``,
case-insensitive) and the older boolean ``true``/``false``. Every enabled value means "emit the
event" here; ``SPAN_ONLY`` and ``SPAN_AND_EVENT`` are accepted so a shared environment does not
break us, but still keep content off spans. Anything else warns once and means off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from ledgerloop.telemetry import semconv as sc

_log = logging.getLogger(__name__)
_warned_values: set[str] = set()


class CaptureMode(StrEnum):
    NO_CONTENT = "NO_CONTENT"
    SPAN_ONLY = "SPAN_ONLY"
    EVENT_ONLY = "EVENT_ONLY"
    SPAN_AND_EVENT = "SPAN_AND_EVENT"

    @property
    def emits_event(self) -> bool:
        """Whether content is captured at all (always as an event, never on spans)."""
        return self is not CaptureMode.NO_CONTENT


def parse_capture_mode(raw: str | None) -> CaptureMode:
    """Read one value of the capture switch; unknown values warn once and mean off."""
    value = (raw or "").strip()
    if not value:
        return CaptureMode.NO_CONTENT
    upper = value.upper()
    if upper == "FALSE":
        return CaptureMode.NO_CONTENT
    if upper == "TRUE":
        # The legacy boolean predates the span/event split; "on" here means the event.
        return CaptureMode.EVENT_ONLY
    try:
        return CaptureMode(upper)
    except ValueError:
        if value not in _warned_values:
            _warned_values.add(value)
            _log.warning(
                "%s=%r is not one of true, false, %s; message content capture stays off",
                sc.ENV_CAPTURE_MESSAGE_CONTENT,
                value,
                ", ".join(CaptureMode),
            )
        return CaptureMode.NO_CONTENT


def capture_mode_from_env(environ: Mapping[str, str] | None = None) -> CaptureMode:
    env = os.environ if environ is None else environ
    return parse_capture_mode(env.get(sc.ENV_CAPTURE_MESSAGE_CONTENT))


# --- Anthropic -> GenAI conversion

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_call",
}


def finish_reason(stop_reason: str) -> str:
    """Anthropic ``stop_reason`` -> GenAI ``FinishReason``; unknown reasons pass through."""
    return _FINISH_REASONS.get(stop_reason, stop_reason)


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "content": text}


def _tool_response(content: Any) -> Any:
    if isinstance(content, str) or content is None:
        return content
    return [_part(block) for block in content if isinstance(block, Mapping)]


def _part(block: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = block.get("type")
    if kind == "text":
        return _text_part(str(block.get("text", "")))
    if kind == "tool_use":
        return {
            "type": "tool_call",
            "id": block.get("id"),
            "name": block.get("name"),
            "arguments": block.get("input"),
        }
    if kind == "tool_result":
        return {
            "type": "tool_call_response",
            "id": block.get("tool_use_id"),
            "response": _tool_response(block.get("content")),
        }
    if kind in ("thinking", "redacted_thinking"):
        # Hidden chain-of-thought is never stored or exported (DESIGN ground rules).
        return None
    # Images, documents, server tools: keep the shape of the conversation, not the payload.
    # Base64 blobs do not belong in telemetry; the journal has them.
    return {"type": str(kind)}


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [_text_part(content)]
    parts = (_part(block) for block in content or () if isinstance(block, Mapping))
    return [part for part in parts if part is not None]


def input_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic ``messages`` -> ``gen_ai.input.messages`` (``{role, parts}`` each).

    Anthropic carries tool results in user turns; a turn made only of tool results becomes a
    ``tool`` message, as the GenAI message schema expects.
    """
    converted = []
    for message in messages:
        parts = _parts(message.get("content"))
        role = str(message.get("role", "user"))
        if parts and all(part["type"] == "tool_call_response" for part in parts):
            role = "tool"
        converted.append({"role": role, "parts": parts})
    return converted


def output_messages(
    message: Mapping[str, Any], default_finish_reason: str | None = None
) -> list[dict[str, Any]]:
    """An Anthropic response (or assistant message) -> ``gen_ai.output.messages``."""
    out: dict[str, Any] = {
        "role": str(message.get("role", "assistant")),
        "parts": _parts(message.get("content")),
    }
    stop_reason = message.get("stop_reason")
    reason = finish_reason(str(stop_reason)) if stop_reason else default_finish_reason
    if reason:
        out["finish_reason"] = reason
    return [out]


def system_instructions(system: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic ``system`` -> ``gen_ai.system_instructions`` (text parts only, per #257)."""
    return [part for part in _parts(system) if part["type"] == "text"]
