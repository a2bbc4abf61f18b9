"""Content capture: off by default, opt-in as one structured event, never on span attributes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledgerloop.telemetry import content
from ledgerloop.telemetry import semconv as sc
from ledgerloop.telemetry.content import CaptureMode, parse_capture_mode
from ledgerloop.telemetry.spans import Telemetry, agent_span, chat_span

ENV = sc.ENV_CAPTURE_MESSAGE_CONTENT
SYSTEM = "You are the ops agent. SECRET-SYSTEM"
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Open a ticket for db-7. SECRET-USER"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Searching first."},
            {"type": "tool_use", "id": "toolu_1", "name": "search_kb", "input": {"q": "db-7"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "KB-42 SECRET-TOOL"}
        ],
    },
]
RESPONSE: dict[str, Any] = {
    "id": "msg_2",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "stop_reason": "tool_use",
    "content": [
        {"type": "thinking", "thinking": "SECRET-THOUGHT", "signature": "sig"},
        {"type": "text", "text": "Filing it. SECRET-ANSWER"},
        {"type": "tool_use", "id": "toolu_2", "name": "write_ticket", "input": {"title": "db-7"}},
    ],
    "usage": {"input_tokens": 10, "output_tokens": 5},
}


@dataclass
class Captured:
    spans: InMemorySpanExporter
    logs: InMemoryLogRecordExporter
    tracers: TracerProvider
    loggers: LoggerProvider

    def telemetry(self, capture: CaptureMode | None = None) -> Telemetry:
        return Telemetry(
            tracer_provider=self.tracers, logger_provider=self.loggers, capture=capture
        )

    def run(self, tel: Telemetry) -> None:
        with (
            agent_span("ops-agent", "run-1", telemetry=tel),
            chat_span(
                "claude-sonnet-4-6",
                server_address="api.anthropic.com",
                server_port=443,
                run_id="run-1",
                step_name="think-1",
                telemetry=tel,
            ) as chat,
        ):
            chat.record_response(RESPONSE)
            chat.record_content(MESSAGES, RESPONSE, system=SYSTEM)

    def everything_on_spans(self) -> str:
        parts = []
        for span in self.spans.get_finished_spans():
            parts.append(repr(dict(span.attributes or {})))
            parts.extend(repr((e.name, dict(e.attributes or {}))) for e in span.events)
            parts.append(repr(span.status.description))
        return "\n".join(parts)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Captured]:
    monkeypatch.delenv(ENV, raising=False)
    spans = InMemorySpanExporter()
    tracers = TracerProvider(shutdown_on_exit=False)
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    logs = InMemoryLogRecordExporter()
    loggers = LoggerProvider(shutdown_on_exit=False)
    loggers.add_log_record_processor(SimpleLogRecordProcessor(logs))
    yield Captured(spans, logs, tracers, loggers)
    tracers.shutdown()
    loggers.shutdown()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, CaptureMode.NO_CONTENT),
        ("", CaptureMode.NO_CONTENT),
        ("false", CaptureMode.NO_CONTENT),
        ("False", CaptureMode.NO_CONTENT),
        ("true", CaptureMode.EVENT_ONLY),
        ("TRUE", CaptureMode.EVENT_ONLY),
        ("no_content", CaptureMode.NO_CONTENT),
        ("SPAN_ONLY", CaptureMode.SPAN_ONLY),
        ("event_only", CaptureMode.EVENT_ONLY),
        (" Span_And_Event ", CaptureMode.SPAN_AND_EVENT),
    ],
)
def test_parse_capture_mode(raw: str | None, expected: CaptureMode) -> None:
    assert parse_capture_mode(raw) is expected


def test_invalid_value_warns_once_and_means_off(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ledgerloop.telemetry.content"):
        assert parse_capture_mode("yes-please") is CaptureMode.NO_CONTENT
        assert parse_capture_mode("yes-please") is CaptureMode.NO_CONTENT
    warnings = [r for r in caplog.records if ENV in r.getMessage()]
    assert len(warnings) == 1
    assert "yes-please" in warnings[0].getMessage()


def test_content_is_off_by_default(captured: Captured) -> None:
    tel = captured.telemetry()  # reads the (unset) environment
    assert tel.capture is CaptureMode.NO_CONTENT
    captured.run(tel)
    assert captured.logs.get_finished_logs() == ()
    assert "SECRET" not in captured.everything_on_spans()
    assert len(captured.spans.get_finished_spans()) == 2


def test_invalid_env_value_falls_back_to_off(
    captured: Captured, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "verbose")
    captured.run(captured.telemetry())
    assert captured.logs.get_finished_logs() == ()
    assert "SECRET" not in captured.everything_on_spans()


@pytest.mark.parametrize("raw", ["true", "EVENT_ONLY", "SPAN_ONLY", "SPAN_AND_EVENT"])
def test_opt_in_emits_one_structured_event_and_spans_stay_clean(
    captured: Captured, monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(ENV, raw)
    captured.run(captured.telemetry())
    assert "SECRET" not in captured.everything_on_spans()  # in every mode, SPAN_* included

    (record,) = captured.logs.get_finished_logs()
    log = record.log_record
    assert log.event_name == "gen_ai.client.inference.operation.details"
    chat = next(s for s in captured.spans.get_finished_spans() if s.name.startswith("chat"))
    assert log.trace_id == chat.context.trace_id
    assert log.span_id == chat.context.span_id

    attrs: dict[str, Any] = dict(log.attributes or {})
    # The inference span's attribute set rides along.
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert attrs[sc.GEN_AI_PROVIDER_NAME] == "anthropic"
    assert attrs[sc.GEN_AI_RESPONSE_ID] == "msg_2"
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 10
    # Structured, not JSON strings (the SDK stores sequences as tuples).
    assert attrs[sc.GEN_AI_SYSTEM_INSTRUCTIONS] == ({"type": "text", "content": SYSTEM},)
    inputs = attrs[sc.GEN_AI_INPUT_MESSAGES]
    assert isinstance(inputs, tuple)
    assert [m["role"] for m in inputs] == ["user", "assistant", "tool"]
    assert inputs[1]["parts"][1] == {
        "type": "tool_call",
        "id": "toolu_1",
        "name": "search_kb",
        "arguments": {"q": "db-7"},
    }
    assert inputs[2]["parts"] == (
        {"type": "tool_call_response", "id": "toolu_1", "response": "KB-42 SECRET-TOOL"},
    )
    (output,) = attrs[sc.GEN_AI_OUTPUT_MESSAGES]
    assert output["finish_reason"] == "tool_call"
    assert [p["type"] for p in output["parts"]] == ["text", "tool_call"]  # thinking dropped
    assert "SECRET-THOUGHT" not in repr(attrs)


def test_conversion_of_other_blocks() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is in this picture?"},
                {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "ok"}],
                    "is_error": True,
                },
            ],
        }
    ]
    (converted,) = content.input_messages(messages)
    assert converted["role"] == "user"  # mixed turn keeps its role
    assert converted["parts"][1] == {"type": "image"}  # no base64 in telemetry
    assert converted["parts"][2]["response"] == [{"type": "text", "content": "ok"}]
    system = [{"type": "text", "text": "rule one"}, {"type": "text", "text": "rule two"}]
    assert content.system_instructions(system) == [
        {"type": "text", "content": "rule one"},
        {"type": "text", "content": "rule two"},
    ]
    (out,) = content.output_messages({"role": "assistant", "content": "done"}, "stop")
    assert out == {
        "role": "assistant",
        "parts": [{"type": "text", "content": "done"}],
        "finish_reason": "stop",
    }
    (unknown,) = content.output_messages({"content": []})
    assert "finish_reason" not in unknown  # not invented when unknown
