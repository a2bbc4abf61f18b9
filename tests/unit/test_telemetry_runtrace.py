"""The pieces of one trace per run, without a database: ids, the root, predecessors."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from ledgerloop.telemetry.content import CaptureMode
from ledgerloop.telemetry.executions import predecessor_from
from ledgerloop.telemetry.runtrace import (
    RunFacts,
    end_run,
    parse_traceparent,
    root_context,
    root_span_id,
    run_trace_id,
    traceparent,
)
from ledgerloop.telemetry.spans import Telemetry

RUN = uuid.UUID("4bf92f35-77b3-4da6-a3ce-929d0e0e4736")


def test_ids_come_from_the_run_id_alone() -> None:
    assert run_trace_id(str(RUN)) == RUN.int
    ctx = root_context(RUN)
    assert ctx.trace_id == RUN.int
    assert ctx.span_id == root_span_id(RUN.int) != 0
    assert root_span_id(uuid.uuid4().int) != ctx.span_id
    assert parse_traceparent(traceparent(ctx)) == ctx


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # invalid trace id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
    ],
)
def test_malformed_traceparents_are_ignored(value: str | None) -> None:
    assert parse_traceparent(value) is None


def _telemetry() -> tuple[Telemetry, InMemorySpanExporter, TracerProvider]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return Telemetry(tracer_provider=provider, capture=CaptureMode.NO_CONTENT), spans, provider


def test_the_root_is_emitted_whole_with_the_runs_identity() -> None:
    tel, spans, provider = _telemetry()
    facts = RunFacts(str(RUN), "ops", tenant_id="t-1", conversation_id="c-1", created_ns=1_000)
    end_run("failed", "model_call_failed", facts=facts, inference_calls=2, telemetry=tel)
    (root,) = spans.get_finished_spans()
    assert root.name == "invoke_agent ops"
    assert root.parent is None
    assert root.context is not None
    assert (root.context.trace_id, root.context.span_id) == (RUN.int, root_span_id(RUN.int))
    assert root.start_time == 1_000
    assert root.status.status_code is StatusCode.ERROR
    attrs = dict(root.attributes or {})
    assert attrs["error.type"] == "model_call_failed"
    assert attrs["gen_ai.agent.name"] == "ops"
    assert attrs["gen_ai.conversation.id"] == "c-1"
    assert attrs["ledgerloop.tenant.id"] == "t-1"
    # Forcing the root's ids leaves every other span's ids to the SDK's generator.
    with tel.tracer.start_as_current_span("other") as other:
        assert other.get_span_context().trace_id != RUN.int
    provider.shutdown()


def test_a_cancelled_run_is_not_an_error() -> None:
    tel, spans, provider = _telemetry()
    end_run("cancelled", "approval_expired", facts=RunFacts(str(RUN), "ops"), telemetry=tel)
    (root,) = spans.get_finished_spans()
    assert root.status.status_code is StatusCode.UNSET
    provider.shutdown()


def test_which_predecessor_is_rebuilt() -> None:
    first = {"span_id": "00f067aa0ba902b7", "start_ns": 5}
    # No resumed execution ever took over: the first one (from the journal) was killed.
    killed = predecessor_from(first, None, 7, 1_234)
    assert killed is not None
    assert (killed.span_id, killed.start_ns, killed.journal_end) == (0x00F067AA0BA902B7, 5, 7)
    assert killed.last_checkpoint_ns == 1_234_000_000
    # A later execution recorded itself and was killed: that one.
    later = predecessor_from(first, {"span_id": "0000000000000abc", "start_ns": 9}, 7, None)
    assert later is not None
    assert later.span_id == 0xABC
    # An execution that ended its own span (hibernated, stopped) is not rebuilt.
    assert (
        predecessor_from(first, {"span_id": "0abc", "start_ns": 9, "end": "stopped"}, 7, None)
        is None
    )
    assert predecessor_from(first, {"end": "stopped"}, 7, None) is None
    # A journal written before executions were recorded: nothing to rebuild.
    assert predecessor_from({"trace_id": "ab", "span_id": "cd"}, None, 7, None) is None
