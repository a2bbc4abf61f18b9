"""Install the OpenTelemetry SDK providers once per process, driven by the standard env vars.

Without an OTLP endpoint and without ``console`` nothing is installed: the API's no-op providers
are the cheapest telemetry there is, and a think step must stay close to a bare DBOS step.
Each signal gets a provider only if it has somewhere to go.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from opentelemetry import _logs, metrics, trace
from opentelemetry.environment_variables import (
    OTEL_LOGS_EXPORTER,
    OTEL_METRICS_EXPORTER,
    OTEL_TRACES_EXPORTER,
)
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    ConsoleLogRecordExporter,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_LOGS_ENDPOINT,
    OTEL_EXPORTER_OTLP_LOGS_PROTOCOL,
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_RESOURCE_ATTRIBUTES,
    OTEL_SDK_DISABLED,
    OTEL_SERVICE_NAME,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)

from ledgerloop.telemetry.content import capture_mode_from_env
from ledgerloop.telemetry.spans import reset_default_telemetry

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_configured = False

HTTP_PROTOBUF = "http/protobuf"
GRPC_PACKAGE = "opentelemetry-exporter-otlp-proto-grpc"


@dataclass
class Providers:
    """What ``configure_telemetry`` would install; ``None`` means leave that signal no-op."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    logger_provider: LoggerProvider | None = None
    problems: list[str] = field(default_factory=list)


def _exporter_names(env: Mapping[str, str], var: str) -> set[str] | None:
    """``OTEL_{SIGNAL}_EXPORTER`` as a set of names; None when unset (our default applies)."""
    value = env.get(var)
    if value is None or not value.strip():
        return None
    return {name.strip().lower() for name in value.split(",") if name.strip()}


def _resource(env: Mapping[str, str], default_service_name: str) -> Resource:
    """The SDK's resource: ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` as the SDK
    reads them (the latter wins), our service name only when neither names one."""
    attributes: dict[str, str] = {}
    for item in env.get(OTEL_RESOURCE_ATTRIBUTES, "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    if env.get(OTEL_SERVICE_NAME):
        attributes[SERVICE_NAME] = env[OTEL_SERVICE_NAME]
    attributes.setdefault(SERVICE_NAME, default_service_name)
    return Resource.create(attributes)


def build_providers(
    service_name: str, *, console: bool, environ: Mapping[str, str] | None = None
) -> Providers:
    """Build, but do not install, SDK providers from ``environ`` (default: the process env).

    Per signal, ``OTEL_{TRACES,METRICS,LOGS}_EXPORTER`` decides, as the SDK documents it
    (``otlp``, ``console``, ``none``, comma-separated). Unset, a signal goes over OTLP when an
    endpoint is configured for it and nowhere otherwise; ``console`` (``--trace-console``)
    adds console output for spans and content events.
    """
    env = os.environ if environ is None else environ
    out = Providers()
    if env.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return out
    generic = bool(env.get(OTEL_EXPORTER_OTLP_ENDPOINT))

    def protocol_ok(protocol_var: str) -> bool:
        protocol = (
            env.get(protocol_var) or env.get(OTEL_EXPORTER_OTLP_PROTOCOL) or HTTP_PROTOBUF
        ).strip()
        if protocol == HTTP_PROTOBUF:
            return True
        if protocol == "grpc":
            problem = (
                f"OTLP over gRPC needs the {GRPC_PACKAGE} package, which Ledgerloop does not "
                f"install; set {OTEL_EXPORTER_OTLP_PROTOCOL}={HTTP_PROTOBUF} (port 4318) instead"
            )
        else:
            problem = (
                f"OTLP protocol {protocol!r} is not supported; "
                f"set {OTEL_EXPORTER_OTLP_PROTOCOL}={HTTP_PROTOBUF}"
            )
        problem += "; nothing is exported over it"
        if problem not in out.problems:
            out.problems.append(problem)
        return False

    def wants(exporter_var: str, endpoint_var: str, protocol_var: str) -> tuple[bool, bool]:
        """(otlp, console) for one signal."""
        names = _exporter_names(env, exporter_var)
        if names is None:
            otlp = generic or bool(env.get(endpoint_var))
            return otlp and protocol_ok(protocol_var), False
        unknown = sorted(names - {"otlp", "console", "none"})
        if unknown:
            out.problems.append(
                f"{exporter_var}={env[exporter_var]!r}: unknown exporter(s) "
                f"{', '.join(unknown)}; use otlp, console or none"
            )
        if "none" in names:
            return False, False
        return ("otlp" in names and protocol_ok(protocol_var)), "console" in names

    resource = _resource(env, service_name)
    otlp_traces, console_traces = wants(
        OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
    )
    console_traces = console_traces or console
    if otlp_traces or console_traces:
        out.tracer_provider = TracerProvider(resource=resource)
        if otlp_traces:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            # No arguments: the exporter reads endpoint, headers, timeout from the environment.
            out.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        if console_traces:
            out.tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    otlp_metrics, console_metrics = wants(
        OTEL_METRICS_EXPORTER,
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
        OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    )
    readers: list[MetricReader] = []
    if otlp_metrics:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if console_metrics:
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    if readers:
        out.meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    otlp_logs, console_logs = wants(
        OTEL_LOGS_EXPORTER, OTEL_EXPORTER_OTLP_LOGS_ENDPOINT, OTEL_EXPORTER_OTLP_LOGS_PROTOCOL
    )
    console_logs = console_logs or console
    logs_endpoint: str | None = None
    logs_unset = env.get(OTEL_LOGS_EXPORTER) is None and not env.get(
        OTEL_EXPORTER_OTLP_LOGS_ENDPOINT
    )
    if logs_unset and not (otlp_logs or console_logs) and capture_mode_from_env(env).emits_event:
        # Content capture is on but nothing says where logs go (traces have an endpoint of
        # their own, or go to the console): the content events follow the traces, or they
        # would be dropped while their spans arrive.
        console_logs = console_traces
        if otlp_traces:
            traces_endpoint = env.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "").rstrip("/")
            if traces_endpoint.endswith("/v1/traces"):
                logs_endpoint = traces_endpoint.removesuffix("/v1/traces") + "/v1/logs"
                otlp_logs = True
            else:
                out.problems.append(
                    "content capture is on but message content events have no destination: "
                    f"set {OTEL_EXPORTER_OTLP_LOGS_ENDPOINT} (or {OTEL_EXPORTER_OTLP_ENDPOINT})"
                )
    if otlp_logs or console_logs:
        # Logs carry only the opt-in content events, so they are quiet unless asked for.
        out.logger_provider = LoggerProvider(resource=resource)
        if otlp_logs:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

            out.logger_provider.add_log_record_processor(
                BatchLogRecordProcessor(OTLPLogExporter(endpoint=logs_endpoint))
            )
        if console_logs:
            out.logger_provider.add_log_record_processor(
                SimpleLogRecordProcessor(ConsoleLogRecordExporter())
            )
    return out


def configure_telemetry(service_name: str = "ledgerloop", *, console: bool = False) -> None:
    """Install SDK providers from the standard ``OTEL_*`` variables; later calls do nothing.

    OTLP goes over HTTP/protobuf when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or a per-signal endpoint
    is set, or when ``OTEL_{SIGNAL}_EXPORTER`` names ``otlp``; ``none`` there turns a signal
    off; ``console`` adds span (and content-event) printing to stdout. Respects
    ``OTEL_SDK_DISABLED``, ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``. A provider
    someone else already installed (e.g. ``opentelemetry-instrument``) is kept.
    """
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
        providers = build_providers(service_name, console=console)
        for problem in providers.problems:
            _log.error("telemetry: %s", problem)
        if providers.tracer_provider is not None:
            if isinstance(trace.get_tracer_provider(), TracerProvider):
                _log.info("telemetry: a TracerProvider is already installed; keeping it")
                providers.tracer_provider.shutdown()
            else:
                trace.set_tracer_provider(providers.tracer_provider)
        if providers.meter_provider is not None:
            if isinstance(metrics.get_meter_provider(), MeterProvider):
                providers.meter_provider.shutdown()
            else:
                metrics.set_meter_provider(providers.meter_provider)
        if providers.logger_provider is not None:
            if isinstance(_logs.get_logger_provider(), LoggerProvider):
                providers.logger_provider.shutdown()
            else:
                _logs.set_logger_provider(providers.logger_provider)
        # The default Telemetry goes through the API's proxies and would follow the new globals
        # anyway; rebuilding it also re-reads the content switch.
        reset_default_telemetry()
