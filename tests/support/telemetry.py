"""In-memory OpenTelemetry providers for tests: what a run's spans, logs and metrics were."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledgerloop.telemetry.content import CaptureMode
from ledgerloop.telemetry.spans import Telemetry, set_telemetry


@dataclass
class Captured:
    spans: InMemorySpanExporter
    logs: InMemoryLogRecordExporter
    metrics: InMemoryMetricReader

    def by_kind(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith(prefix)]


def capture_telemetry(capture: CaptureMode) -> Iterator[Captured]:
    spans, logs, reader = (
        InMemorySpanExporter(),
        InMemoryLogRecordExporter(),
        InMemoryMetricReader(),
    )
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    meter_provider = MeterProvider(metric_readers=[reader])
    set_telemetry(
        Telemetry(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            logger_provider=logger_provider,
            capture=capture,
        )
    )
    yield Captured(spans, logs, reader)
    set_telemetry(None)
    tracer_provider.shutdown()
    logger_provider.shutdown()
    meter_provider.shutdown()
