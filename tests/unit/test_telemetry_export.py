"""Export over real OTLP/HTTP to a loopback receiver, and provider setup from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from ledgerloop.telemetry import semconv as sc
from ledgerloop.telemetry.content import CaptureMode
from ledgerloop.telemetry.setup import GRPC_PACKAGE, build_providers
from ledgerloop.telemetry.spans import Telemetry, agent_span, chat_span
from ledgerloop.telemetry.tool_spans import McpCall, tool_span
from tests.support.otlp import Receiver, running_receiver

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as server:
        yield server


def test_spans_reach_a_real_otlp_http_receiver(receiver: Receiver) -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    # Simple processor: each span is POSTed before end() returns, so no waiting is needed.
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces"))
    )
    tel = Telemetry(tracer_provider=provider, capture=CaptureMode.NO_CONTENT)
    with agent_span("ops-agent", "run-1", telemetry=tel):
        with chat_span(
            "claude-sonnet-4-6",
            server_address="api.anthropic.com",
            server_port=443,
            run_id="run-1",
            step_name="think-0",
            telemetry=tel,
        ) as chat:
            chat.record_response({"stop_reason": "tool_use"})
        with tool_span(
            "write_ticket",
            "toolu_1",
            run_id="run-1",
            step_name="act-0",
            mcp=McpCall(),
            telemetry=tel,
        ):
            pass
    provider.shutdown()

    assert receiver.span_names() == {
        "invoke_agent ops-agent",
        "chat claude-sonnet-4-6",
        "execute_tool write_ticket",
    }
    scopes = [
        scope
        for request in receiver.traces()
        for resource in request.resource_spans
        for scope in resource.scope_spans
    ]
    assert {scope.schema_url for scope in scopes} == {sc.SCHEMA_URL}
    tool = next(s for scope in scopes for s in scope.spans if s.name.startswith("execute_tool"))
    attrs = {kv.key: kv.value.string_value for kv in tool.attributes}
    assert attrs[sc.MCP_METHOD_NAME] == "tools/call"
    assert attrs[sc.LEDGERLOOP_RUN_ID] == "run-1"


CHILD = textwrap.dedent(
    """
    from ledgerloop.telemetry import (
        agent_span, chat_span, configure_telemetry, empty_turn, tool_span,
    )

    configure_telemetry(console=False)
    configure_telemetry(console=False)  # twice is harmless
    with agent_span("ops-agent", "run-9"):
        with chat_span("m-1", server_address=None, server_port=None, run_id="run-9",
                       step_name="think-0") as chat:
            chat.record_response({"usage": {"input_tokens": 3, "output_tokens": 1}})
            # A no-op unless content capture is on.
            chat.record_content([{"role": "user", "content": "hi"}], {"content": []})
        with tool_span("search_kb", "c1", run_id="run-9", step_name="act-0"):
            pass
    empty_turn("ops-agent", "m-1")
    print("done")
    """
)


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra)
    return env


def _run_child(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A fresh interpreter: global providers can be set only once per process.
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", CHILD],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_configure_telemetry_exports_over_otlp_http(receiver: Receiver) -> None:
    env = _child_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_SERVICE_NAME="ll-test")
    result = _run_child(env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert result.stderr == ""
    # Batch processor and periodic reader flush at interpreter exit.
    assert receiver.span_names() == {
        "invoke_agent ops-agent",
        "chat m-1",
        "execute_tool search_kb",
    }
    (request,) = receiver.traces()
    resource = {
        kv.key: kv.value.string_value for kv in request.resource_spans[0].resource.attributes
    }
    assert resource["service.name"] == "ll-test"
    with receiver.lock:
        metric_bodies = list(receiver.bodies.get("/v1/metrics", []))
    names = {
        metric.name
        for body in metric_bodies
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics
        for scope in rm.scope_metrics
        for metric in scope.metrics
    }
    assert {
        "gen_ai.invoke_agent.duration",
        "gen_ai.client.token.usage",
        "gen_ai.execute_tool.duration",
        "ledgerloop.agent.empty_turns",
    } <= names


def test_grpc_protocol_is_a_clear_error_not_a_crash() -> None:
    env = _child_env(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4317", OTEL_EXPORTER_OTLP_PROTOCOL="grpc"
    )
    result = _run_child(env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert GRPC_PACKAGE in result.stderr
    assert "http/protobuf" in result.stderr


def test_build_providers_from_environment() -> None:
    nothing = build_providers("ledgerloop", console=False, environ={})
    assert (nothing.tracer_provider, nothing.meter_provider, nothing.logger_provider) == (
        None,
        None,
        None,
    )
    assert nothing.problems == []

    console = build_providers("ledgerloop", console=True, environ={"OTEL_SERVICE_NAME": "svc"})
    assert console.tracer_provider is not None
    assert console.logger_provider is not None
    assert console.meter_provider is None  # metrics only go to a backend
    assert console.tracer_provider.resource.attributes["service.name"] == "svc"
    console.tracer_provider.shutdown()
    console.logger_provider.shutdown()

    disabled = build_providers(
        "ledgerloop",
        console=True,
        environ={"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"},
    )
    assert disabled.tracer_provider is None
    assert disabled.logger_provider is None

    grpc = build_providers(
        "ledgerloop",
        console=False,
        environ={
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4317",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        },
    )
    assert grpc.tracer_provider is None
    (problem,) = grpc.problems
    assert GRPC_PACKAGE in problem

    json = build_providers(
        "ledgerloop",
        console=False,
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
        },
    )
    assert json.tracer_provider is None
    assert json.meter_provider is None
    assert len(json.problems) == 1  # said once, not once per signal


def _bodies(receiver: Receiver, path: str) -> list[bytes]:
    with receiver.lock:
        return list(receiver.bodies.get(path, []))


def test_content_events_travel_the_logs_pipeline_with_timestamps(receiver: Receiver) -> None:
    env = _child_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="EVENT_ONLY",
    )
    result = _run_child(env)
    assert result.returncode == 0, result.stderr
    records = [
        record
        for body in _bodies(receiver, "/v1/logs")
        for rl in ExportLogsServiceRequest.FromString(body).resource_logs
        for scope in rl.scope_logs
        for record in scope.log_records
    ]
    (event,) = records
    assert event.event_name == "gen_ai.client.inference.operation.details"
    assert event.time_unix_nano > 0
    assert event.observed_time_unix_nano >= event.time_unix_nano
    assert event.span_id  # correlated with its chat span


def test_exporter_switches_and_resource_attributes_are_honoured(receiver: Receiver) -> None:
    env = _child_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="EVENT_ONLY",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_RESOURCE_ATTRIBUTES="service.name=from-attributes,deployment.environment=ci",
    )
    result = _run_child(env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "chat m-1" in receiver.span_names()
    # The two switched-off signals sent nothing, though they had an endpoint and data.
    assert _bodies(receiver, "/v1/metrics") == []
    assert _bodies(receiver, "/v1/logs") == []
    (request,) = receiver.traces()
    resource = {
        kv.key: kv.value.string_value for kv in request.resource_spans[0].resource.attributes
    }
    assert resource["service.name"] == "from-attributes"
    assert resource["deployment.environment"] == "ci"


def test_exporter_variables_per_signal() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    off = build_providers(
        "ledgerloop", console=False, environ={**endpoint, "OTEL_TRACES_EXPORTER": "none"}
    )
    assert off.tracer_provider is None
    assert off.meter_provider is not None  # the other signals keep their endpoint
    off.meter_provider.shutdown()

    console = build_providers(
        "ledgerloop", console=False, environ={"OTEL_TRACES_EXPORTER": "console"}
    )
    assert console.tracer_provider is not None  # no endpoint needed for the console
    assert console.meter_provider is None
    console.tracer_provider.shutdown()

    named = build_providers(
        "ledgerloop",
        console=False,
        environ={
            "OTEL_SERVICE_NAME": "wins",
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=loses,team=ops%20core",
            "OTEL_TRACES_EXPORTER": "console",
        },
    )
    assert named.tracer_provider is not None
    attributes = named.tracer_provider.resource.attributes
    assert attributes["service.name"] == "wins"
    assert attributes["team"] == "ops core"
    named.tracer_provider.shutdown()

    typo = build_providers("ledgerloop", console=False, environ={"OTEL_LOGS_EXPORTER": "otpl"})
    (problem,) = typo.problems
    assert "otpl" in problem
    assert "otlp, console or none" in problem


def test_content_events_follow_traces_when_logs_have_no_exporter(receiver: Receiver) -> None:
    # Traces have an endpoint of their own; nothing names one for logs.
    env = _child_env(
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{receiver.url}/v1/traces",
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="EVENT_ONLY",
    )
    result = _run_child(env)
    assert result.returncode == 0, result.stderr
    assert "chat m-1" in receiver.span_names()
    events = [
        record.event_name
        for body in _bodies(receiver, "/v1/logs")
        for rl in ExportLogsServiceRequest.FromString(body).resource_logs
        for scope in rl.scope_logs
        for record in scope.log_records
    ]
    assert events == ["gen_ai.client.inference.operation.details"]


def test_content_events_follow_console_traces_only_when_captured() -> None:
    capture = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY"}
    traced = {"OTEL_TRACES_EXPORTER": "console"}
    following = build_providers("ledgerloop", console=False, environ={**traced, **capture})
    assert following.logger_provider is not None
    assert following.tracer_provider is not None
    following.logger_provider.shutdown()
    following.tracer_provider.shutdown()
    quiet = build_providers("ledgerloop", console=False, environ=traced)
    assert quiet.logger_provider is None  # no content, no logs
    assert quiet.tracer_provider is not None
    quiet.tracer_provider.shutdown()
    # Logs switched off on purpose stay off.
    off = build_providers(
        "ledgerloop",
        console=False,
        environ={**traced, **capture, "OTEL_LOGS_EXPORTER": "none"},
    )
    assert off.logger_provider is None
    assert off.tracer_provider is not None
    off.tracer_provider.shutdown()
    # A traces endpoint whose logs sibling cannot be told: said, not guessed.
    odd = build_providers(
        "ledgerloop",
        console=False,
        environ={**capture, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/t"},
    )
    assert odd.logger_provider is None
    (problem,) = odd.problems
    assert "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT" in problem
    assert odd.tracer_provider is not None
    odd.tracer_provider.shutdown()
