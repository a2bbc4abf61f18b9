"""GenAI metrics: names, units, advisory buckets, per-invocation counts, attribute sets."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledgerloop.pricing import ModelPrice
from ledgerloop.telemetry import semconv as sc
from ledgerloop.telemetry.content import CaptureMode
from ledgerloop.telemetry.spans import Telemetry, agent_span, chat_span, empty_turn
from ledgerloop.telemetry.tool_spans import tool_span

USAGE = {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 1000}


@dataclass
class Measured:
    tel: Telemetry
    reader: InMemoryMetricReader
    spans: InMemorySpanExporter

    def metrics(self) -> dict[str, Metric]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return {
            metric.name: metric
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }

    def points(self, name: str) -> list[Any]:
        return list(self.metrics()[name].data.data_points)


@pytest.fixture
def measured() -> Iterator[Measured]:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    spans = InMemorySpanExporter()
    tracers = TracerProvider(shutdown_on_exit=False)
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    tel = Telemetry(tracer_provider=tracers, meter_provider=meters, capture=CaptureMode.NO_CONTENT)
    yield Measured(tel, reader, spans)
    meters.shutdown()
    tracers.shutdown()


def chat(tel: Telemetry, model: str = "claude-haiku-4-5", usage: Any = USAGE) -> None:
    with chat_span(
        model,
        server_address="api.anthropic.com",
        server_port=443,
        run_id="run-1",
        step_name="think",
        telemetry=tel,
    ) as rec:
        rec.record_response({"id": "m", "model": f"{model}-20260101", "usage": usage})


def tool(tel: Telemetry, name: str = "search_kb") -> None:
    with tool_span(name, "call", run_id="run-1", step_name="act", telemetry=tel):
        pass


def test_names_units_and_bucket_boundaries(measured: Measured) -> None:
    with agent_span("ops-agent", "run-1", telemetry=measured.tel):
        chat(measured.tel)
        tool(measured.tel)
    empty_turn("ops-agent", "claude-haiku-4-5", telemetry=measured.tel)
    expected = {
        "gen_ai.client.operation.duration": ("s", sc.BUCKETS_CLIENT_DURATION),
        "gen_ai.client.token.usage": ("{token}", sc.BUCKETS_TOKEN_USAGE),
        "gen_ai.invoke_agent.duration": ("s", sc.BUCKETS_INVOKE_AGENT_DURATION),
        "gen_ai.invoke_agent.inference_calls": ("{inference_call}", sc.BUCKETS_INVOKE_AGENT_CALLS),
        "gen_ai.invoke_agent.tool_calls": ("{tool_call}", sc.BUCKETS_INVOKE_AGENT_CALLS),
        "gen_ai.execute_tool.duration": ("s", sc.BUCKETS_CLIENT_DURATION),
    }
    metrics = measured.metrics()
    assert set(metrics) == {*expected, "ledgerloop.agent.empty_turns"}
    for name, (unit, buckets) in expected.items():
        assert metrics[name].unit == unit, name
        for point in metrics[name].data.data_points:
            assert tuple(point.explicit_bounds) == buckets, name
    # Spot-check the literal spec values so a typo in semconv.py cannot hide behind itself.
    assert sc.BUCKETS_CLIENT_DURATION[:3] == (0.01, 0.02, 0.04)
    assert sc.BUCKETS_CLIENT_DURATION[-1] == 81.92
    assert sc.BUCKETS_TOKEN_USAGE[-1] == 67108864
    assert sc.BUCKETS_INVOKE_AGENT_DURATION[-1] == 409.6
    assert sc.BUCKETS_INVOKE_AGENT_CALLS == (1, 2, 4, 8, 16, 32, 64, 128)
    turns = metrics["ledgerloop.agent.empty_turns"]
    assert turns.unit == "{turn}"
    (point,) = turns.data.data_points
    assert point.value == 1
    assert dict(point.attributes) == {
        sc.GEN_AI_AGENT_NAME: "ops-agent",
        sc.GEN_AI_REQUEST_MODEL: "claude-haiku-4-5",
    }


def test_calls_are_counted_per_invocation_excluding_sub_agents(measured: Measured) -> None:
    tel = measured.tel
    with agent_span("planner", "run-1", telemetry=tel) as planner:
        chat(tel)
        tool(tel)
        with agent_span("researcher", "run-1", telemetry=tel) as researcher:
            chat(tel)
            chat(tel)
            tool(tel)
            tool(tel)
            tool(tel)
        chat(tel)
    assert (planner.inference_calls, planner.tool_calls) == (2, 1)
    assert (researcher.inference_calls, researcher.tool_calls) == (2, 3)
    by_agent = {
        name: {
            dict(p.attributes)[sc.GEN_AI_AGENT_NAME]: (p.count, p.sum)
            for p in measured.points(name)
        }
        for name in ("gen_ai.invoke_agent.inference_calls", "gen_ai.invoke_agent.tool_calls")
    }
    assert by_agent["gen_ai.invoke_agent.inference_calls"] == {
        "planner": (1, 2),
        "researcher": (1, 2),
    }
    assert by_agent["gen_ai.invoke_agent.tool_calls"] == {"planner": (1, 1), "researcher": (1, 3)}


def test_failed_calls_count_and_carry_error_type(measured: Measured) -> None:
    tel = measured.tel
    with (
        pytest.raises(TimeoutError),
        agent_span("ops-agent", "run-1", telemetry=tel) as inv,
        chat_span(
            "m", server_address=None, server_port=None, run_id="r", step_name="s", telemetry=tel
        ),
    ):
        raise TimeoutError
    assert inv.inference_calls == 1
    (duration,) = measured.points("gen_ai.client.operation.duration")
    assert dict(duration.attributes)[sc.ERROR_TYPE] == "TimeoutError"
    (agent,) = measured.points("gen_ai.invoke_agent.duration")
    assert dict(agent.attributes) == {
        sc.GEN_AI_AGENT_NAME: "ops-agent",
        sc.ERROR_TYPE: "TimeoutError",
    }
    assert "gen_ai.client.token.usage" not in measured.metrics()  # no counts, no report


def test_token_usage_and_duration_attributes(measured: Measured) -> None:
    chat(measured.tel)
    usage = {
        dict(p.attributes)[sc.GEN_AI_TOKEN_TYPE]: p
        for p in measured.points("gen_ai.client.token.usage")
    }
    assert usage["input"].sum == 1100  # input + cache read
    assert usage["output"].sum == 20
    common = {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_PROVIDER_NAME: "anthropic",
        sc.GEN_AI_REQUEST_MODEL: "claude-haiku-4-5",
        sc.GEN_AI_RESPONSE_MODEL: "claude-haiku-4-5-20260101",
        sc.SERVER_ADDRESS: "api.anthropic.com",
        sc.SERVER_PORT: 443,
    }
    assert dict(usage["input"].attributes) == {**common, sc.GEN_AI_TOKEN_TYPE: "input"}
    (duration,) = measured.points("gen_ai.client.operation.duration")
    # Run and step ids are span attributes only: per-run metric series would explode.
    assert dict(duration.attributes) == common


def test_tool_duration_attributes(measured: Measured) -> None:
    with (
        agent_span("ops-agent", "run-1", telemetry=measured.tel),
        tool_span("write_ticket", "c", run_id="r", step_name="s", telemetry=measured.tel) as rec,
    ):
        rec.record_error("PolicyDenied", "needs approval")
    (point,) = measured.points("gen_ai.execute_tool.duration")
    assert dict(point.attributes) == {
        sc.GEN_AI_TOOL_NAME: "write_ticket",
        sc.GEN_AI_TOOL_TYPE: "function",
        sc.GEN_AI_AGENT_NAME: "ops-agent",
        sc.ERROR_TYPE: "PolicyDenied",
    }


def test_agent_duration_equals_span_duration(measured: Measured) -> None:
    with agent_span("ops-agent", "run-1", request_model="claude-haiku-4-5", telemetry=measured.tel):
        chat(measured.tel)
    (point,) = measured.points("gen_ai.invoke_agent.duration")
    span = next(s for s in measured.spans.get_finished_spans() if s.name.startswith("invoke_agent"))
    assert span.start_time is not None
    assert span.end_time is not None
    assert point.sum == pytest.approx((span.end_time - span.start_time) / 1e9, abs=1e-9)
    assert dict(point.attributes)[sc.GEN_AI_REQUEST_MODEL] == "claude-haiku-4-5"


def test_model_calls_are_costed_by_the_price_table(measured: Measured) -> None:
    measured.tel.prices = {
        "claude-haiku-4-5": ModelPrice(input_per_mtok=1.0, output_per_mtok=5.0),
    }
    chat(measured.tel)  # responds as claude-haiku-4-5-20260101: priced by its family's entry
    chat(measured.tel, model="unpriced-model")
    (point,) = measured.points("ledgerloop.gen_ai.client.cost")
    assert measured.metrics()["ledgerloop.gen_ai.client.cost"].unit == "USD"
    # 1,100 input tokens (cache reads included) at $1/M and 20 output at $5/M.
    assert point.value == pytest.approx((1100 * 1.0 + 20 * 5.0) / 1_000_000)
    assert point.attributes[sc.GEN_AI_RESPONSE_MODEL] == "claude-haiku-4-5-20260101"
