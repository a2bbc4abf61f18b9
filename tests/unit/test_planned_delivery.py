"""A delivery span planned before it starts carries, once started, the headers planned for
it: the request built with them while the effect's record commits (Relay.prepare) goes out
as if built after, whether spans record or not."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledgerloop.telemetry.effect_spans import delivery_span, plan_delivery
from ledgerloop.telemetry.spans import Telemetry

TOOL = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _start(telemetry: Telemetry) -> tuple[dict[str, str], dict[str, str], int | None]:
    plan = plan_delivery(TOOL, telemetry)
    assert plan is not None
    with delivery_span(
        "POST",
        "http://tickets.example/t",
        idempotency_key="run:call",
        attempt=1,
        tool_traceparent=TOOL,
        telemetry=telemetry,
        planned=plan,
    ) as span:
        return plan.headers, span.headers, plan.span_id


def test_a_recorded_delivery_starts_with_the_planned_span_id() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    planned, started, span_id = _start(Telemetry(tracer_provider=provider))
    assert planned == started
    (span,) = exporter.get_finished_spans()
    assert span.context.span_id == span_id
    assert span.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert planned["traceparent"] == f"00-{span.context.trace_id:032x}-{span_id:016x}-01"


def test_an_unrecorded_delivery_carries_what_it_would_have_carried() -> None:
    # The API's tracer (no SDK): the span hands on its parent's context, as planned.
    planned, started, _ = _start(Telemetry())
    assert planned == started
    assert planned["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")


def test_an_effect_recorded_without_tracing_is_not_planned() -> None:
    assert plan_delivery(None, Telemetry()) is None
