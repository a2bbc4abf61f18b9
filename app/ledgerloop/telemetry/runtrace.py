"""One trace per run, whatever happens to it: crashes, hibernation, waits of hours.

    invoke_agent {agent}         root; trace id = the run id, span id derived from it;
    │                            emitted whole, once, by whoever ends the run
    ├── execution {agent}        one per execution (a process's stretch of the run)
    │   ├── chat {model}
    │   └── execute_tool {tool}
    ├── await_approval {tool}    a wait, with the approval id and how long it took
    ├── execution {agent}        interrupted: emitted by the execution that took over
    │   └── chat {model}         lost: the call in flight when the process died
    ├── POST                     the relay's delivery (CLIENT), linked to its execute_tool
    └── reconcile_effect {tool}  the reconciler settling an effect

Why the root is emitted at the end and not held open: a span exists for a backend only once
it has ended, so a root opened by the first execution would die with that process (SIGKILL,
OOM) and orphan everything under it. Its identity is therefore fixed without any state, from
the run id alone (``run_trace_id``, ``root_span_id``; SQL has ``ledgerloop.run_traceparent``),
so every process can parent to it, and the step that moves the run to a terminal status
emits it with the run's creation time as its start.

Executions are spans a process ends itself when it completes, fails, hibernates or stops. A
killed one cannot; the next execution of the run finds it (the first execution's id is in the
journal, later ones are recorded in ``agent_run.execution`` when they take over, which only
resumed executions do) and emits it, ERROR ``execution_interrupted``, with the same span id,
so spans it exported before dying keep their parent. If the step it died in was a model
call, that call is reported as a lost ``chat`` span and counted in ``ledgerloop.agent.lost_calls``.

Ids are forced through the SDK's id generator; with any other tracer provider the root and
reconstructed spans get random ids (everything still works, but the tree is not joined).
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import (
    Link,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
)

from ledgerloop.telemetry import semconv as sc
from ledgerloop.telemetry.spans import Attrs, Telemetry, _elapsed_s, _set_error, get_telemetry

_ROOT_SALT = b"ledgerloop.run.root:"
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)

# --- identities


def run_trace_id(run_id: str | uuid.UUID) -> int:
    """The run's trace id: its UUID's 128 bits (so a trace is found by the run id)."""
    return (run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))).int


def root_span_id(trace_id: int) -> int:
    """The root span id of the run whose trace id this is: sha256 of a salt and the id."""
    digest = hashlib.sha256(_ROOT_SALT + trace_id.to_bytes(16, "big")).digest()
    return int.from_bytes(digest[:8], "big") or 1


def root_context(run_id: str | uuid.UUID, *, sampled: bool = True) -> SpanContext:
    """The run's root span context: a parent any process can use, before the root exists."""
    trace_id = run_trace_id(run_id)
    flags = _SAMPLED if sampled else TraceFlags(TraceFlags.DEFAULT)
    return SpanContext(trace_id, root_span_id(trace_id), is_remote=True, trace_flags=flags)


def traceparent(ctx: SpanContext) -> str:
    """The W3C ``traceparent`` header value of a span context."""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse_traceparent(value: str | None) -> SpanContext | None:
    """A W3C ``traceparent`` as a remote span context; None when absent or malformed."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or parts[0] == "ff":
        return None
    try:
        ctx = SpanContext(
            int(parts[1], 16),
            int(parts[2], 16),
            is_remote=True,
            trace_flags=TraceFlags(int(parts[3][:2], 16) & 0x01),
        )
    except ValueError:
        return None
    return ctx if ctx.is_valid else None


@contextmanager
def under_root(run_id: str) -> Iterator[None]:
    """Make the run's root the current span: for work outside any execution span (a run
    failing on an error the loop did not plan for), so what it opens stays in the trace."""
    with trace.use_span(trace.NonRecordingSpan(root_context(run_id)), end_on_exit=False):
        yield


def span_traceparent(span: Span | None = None) -> str | None:
    """The traceparent of ``span`` (default: the current span), or None when not recording."""
    ctx = (span or trace.get_current_span()).get_span_context()
    return traceparent(ctx) if ctx.is_valid else None


def trace_headers() -> dict[str, str]:
    """``{"traceparent": ...}`` for the current span, or ``{}`` when not recording."""
    value = span_traceparent()
    return {"traceparent": value} if value else {}


def new_span_id() -> int:
    return random.getrandbits(64) or 1


# --- forced ids: spans whose identity is decided by the run, not by the generator

_FORCED: ContextVar[tuple[int, int] | None] = ContextVar("ledgerloop_forced_ids", default=None)


class _ForcedIds(IdGenerator):
    """The SDK's generator, except inside ``_forcing``: then the ids given there."""

    def __init__(self, inner: IdGenerator) -> None:
        self.inner = inner

    def generate_span_id(self) -> int:
        forced = _FORCED.get()
        return forced[1] if forced else self.inner.generate_span_id()

    def generate_trace_id(self) -> int:
        forced = _FORCED.get()
        return forced[0] if forced else self.inner.generate_trace_id()


def _sdk_tracer(tel: Telemetry) -> SdkTracer | None:
    tracer = tel.tracer
    real = getattr(tracer, "_tracer", tracer)  # a ProxyTracer resolves to the global's
    return real if isinstance(real, SdkTracer) else None


def recording(tel: Telemetry | None = None) -> bool:
    """Whether spans go anywhere (an SDK tracer); without one, run tracing does no I/O."""
    return _sdk_tracer(tel or get_telemetry()) is not None


def _start(
    tel: Telemetry,
    name: str,
    *,
    trace_id: int,
    span_id: int,
    parent: SpanContext | None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attrs | None = None,
    links: Sequence[Link] = (),
    start_time: int | None = None,
) -> Span:
    """Start a span with the given ids (under the SDK), parented to ``parent`` or a root."""
    real = _sdk_tracer(tel)
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else None
    if context is None:
        # No parent: an explicit empty context, or the current span would become the parent.
        context = Context()
    with forcing_ids(tel, trace_id, span_id):
        return (real or tel.tracer).start_span(
            name,
            context=context,
            kind=kind,
            attributes=attributes,
            links=links,
            start_time=start_time,
        )


@contextmanager
def forcing_ids(tel: Telemetry, trace_id: int, span_id: int) -> Iterator[None]:
    """Spans started inside get `span_id` (and `trace_id` when they have no parent): a span
    whose identity was decided, and handed to others, before it started."""
    real = _sdk_tracer(tel)
    if real is not None and not isinstance(real.id_generator, _ForcedIds):
        real.id_generator = _ForcedIds(real.id_generator)
    token = _FORCED.set((trace_id, span_id))
    try:
        yield
    finally:
        _FORCED.reset(token)


def planned_span() -> tuple[str, tuple[int, int]] | None:
    """A traceparent for a span not started yet, a child of the current span's trace, with
    its ids (for `forcing_ids`); None when nothing records."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    planned = SpanContext(ctx.trace_id, new_span_id(), is_remote=False, trace_flags=ctx.trace_flags)
    return traceparent(planned), (ctx.trace_id, planned.span_id)


def sampled(tel: Telemetry, trace_id: int) -> bool:
    """What the SDK's sampler decides for the run's root (deterministic per trace id)."""
    real = _sdk_tracer(tel)
    if real is None:
        return False
    result = real.sampler.should_sample(None, trace_id, sc.OPERATION_INVOKE_AGENT)
    return result.decision is Decision.RECORD_AND_SAMPLE


# --- the run and its executions


@dataclass
class RunFacts:
    """What every span of a run says about it; all of it read from the run's journal."""

    run_id: str
    agent: str
    tenant_id: str | None = None
    conversation_id: str | None = None
    #: The run's creation (ns since the epoch): the root span's start.
    created_ns: int | None = None

    def attributes(self) -> Attrs:
        attrs: Attrs = {sc.GEN_AI_AGENT_NAME: self.agent, sc.LEDGERLOOP_RUN_ID: self.run_id}
        if self.conversation_id:
            attrs[sc.GEN_AI_CONVERSATION_ID] = self.conversation_id
        if self.tenant_id:
            attrs[sc.LEDGERLOOP_TENANT_ID] = self.tenant_id
        return attrs


# --- the root


def end_run(
    status: str,
    reason: str,
    *,
    facts: RunFacts | None = None,
    inference_calls: int | None = None,
    tool_calls: int | None = None,
    usage: tuple[int, int] | None = None,
    links: Sequence[SpanContext] = (),
    flush: bool = True,
    telemetry: Telemetry | None = None,
) -> None:
    """Emit the run's root ``invoke_agent {agent}``, whole: from the run's creation to now.

    Call it after the commit that made the run terminal, from a step body (so a replay emits
    nothing). ``facts`` default to the current execution's. A ``failed`` run is ERROR with
    ``error.type`` = its reason. Records ``gen_ai.invoke_agent.duration`` (same error.type)
    and the run's call counts. ``usage``: the run's (input, output) tokens, every model call
    of the run (replayed ones included), as ``gen_ai.usage.*``. Flushes the tracer provider:
    the root is the one span whose loss would orphan a whole run, so it should not wait in a
    batch for the next crash.
    """
    tel = telemetry or get_telemetry()
    if _sdk_tracer(tel) is None:
        return
    if facts is None:
        return  # nothing known of the run (executions.end_run_here passes its facts)
    trace_id = run_trace_id(facts.run_id)
    end_ns = time.time_ns()
    start_ns = min(facts.created_ns or end_ns, end_ns)
    attrs = facts.attributes()
    attrs[sc.GEN_AI_OPERATION_NAME] = sc.OPERATION_INVOKE_AGENT
    attrs[sc.LEDGERLOOP_RUN_STATUS] = status
    attrs[sc.LEDGERLOOP_RUN_REASON] = reason
    if usage is not None:
        attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = usage
    span = _start(
        tel,
        sc.agent_span_name(facts.agent),
        trace_id=trace_id,
        span_id=root_span_id(trace_id),
        parent=None,
        attributes=attrs,
        links=[Link(ctx) for ctx in links if ctx.is_valid],
        start_time=start_ns,
    )
    error_type = reason if status == "failed" else None
    if error_type:
        _set_error(span, error_type, f"the run failed: {reason}")
    span.end(end_time=end_ns)
    counts: Attrs = {sc.GEN_AI_AGENT_NAME: facts.agent}
    duration = dict(counts)
    if error_type:
        duration[sc.ERROR_TYPE] = error_type
    ins = tel.instruments
    ins.invoke_agent_duration.record(_elapsed_s(start_ns, end_ns), duration)
    if inference_calls is not None:
        ins.invoke_agent_inference_calls.record(inference_calls, counts)
    if tool_calls is not None:
        ins.invoke_agent_tool_calls.record(tool_calls, counts)
    if flush:
        _flush(tel)


def _flush(tel: Telemetry) -> None:
    real = _sdk_tracer(tel)
    provider = trace.get_tracer_provider() if tel.tracer_provider is None else tel.tracer_provider
    flush = getattr(provider, "force_flush", None)
    if real is not None and callable(flush):
        flush(2000)


# --- where a run starts


class RunStart:
    """Handle for the span of a request that starts a run."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def started(self, run_id: str | uuid.UUID, status_code: int) -> None:
        """Link this request to the run it started (or, for a repeat, already had)."""
        self.span.add_link(root_context(run_id))
        self.span.set_attribute(sc.LEDGERLOOP_RUN_ID, str(run_id))
        self.span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, status_code)


@contextmanager
def run_start_span(
    method: str,
    route: str,
    *,
    incoming_traceparent: str | None,
    telemetry: Telemetry | None = None,
) -> Iterator[RunStart]:
    """``{METHOD} {route}`` (SERVER) around a request that starts a run: in the caller's trace
    when it sent a ``traceparent``, linked to the run's root (the run has a trace of its own:
    it may outlive the request by hours). An exception marks it ERROR.

    When the request already has a SERVER span (an instrumentation of the web framework,
    such as opentelemetry-instrument's for FastAPI, opened it in the caller's trace), that
    span is the request's one span: it gets the link and the run's id, and no second one is
    made in a trace of its own."""
    tel = telemetry or get_telemetry()
    current = trace.get_current_span()
    if current.is_recording() and getattr(current, "kind", None) is SpanKind.SERVER:
        current.set_attribute(sc.HTTP_ROUTE, route)
        try:
            yield RunStart(current)
        except BaseException as exc:
            _set_error(current, type(exc).__name__, str(exc))
            raise
        return  # the instrumentation ends it
    parent = parse_traceparent(incoming_traceparent)
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else Context()
    span = tel.tracer.start_span(
        f"{method} {route}",
        context=context,
        kind=SpanKind.SERVER,
        attributes={sc.HTTP_REQUEST_METHOD: method, sc.HTTP_ROUTE: route},
    )
    try:
        yield RunStart(span)
    except BaseException as exc:
        _set_error(span, type(exc).__name__, str(exc))
        raise
    finally:
        span.end()
