"""GenAI spans for the durable agent loop: invoke_agent over chat and execute_tool.

A run is one trace tree::

    invoke_agent {agent}        INTERNAL
      chat {model}              CLIENT     one per model call (think step)
      execute_tool {tool}       INTERNAL   one per tool call (act step); MCP attributes merged in

Replay rule: the durable engine answers completed steps from its journal when a run resumes.
Those steps did not happen again, so callers MUST NOT open ``chat_span`` or ``tool_span`` for a
step answered from the journal: only for a step whose body actually runs. Nothing here can tell
a replayed step from a fresh one, and nothing here emits on its own.

Parenting and the per-invocation call counts follow the current context (contextvars), so open
chat and tool spans in the same task or thread as their ``agent_span``, or in a copy of its
context.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import LoggerProvider, SeverityNumber, get_logger
from opentelemetry.metrics import MeterProvider, get_meter
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TracerProvider,
)
from opentelemetry.util.types import AttributeValue

from ledgerloop.pricing import ModelPrice, cost_usd
from ledgerloop.telemetry import content
from ledgerloop.telemetry import semconv as sc
from ledgerloop.telemetry.content import CaptureMode, capture_mode_from_env
from ledgerloop.telemetry.metrics import Instruments
from ledgerloop.version import __version__

# Status descriptions are for humans scanning a trace, not for payloads.
_MAX_DESCRIPTION = 512

Attrs = dict[str, AttributeValue]


class Telemetry:
    """Tracer, metric instruments, event logger and content switch for one set of providers.

    Pass providers to bind to them (tests pass in-memory ones); leave them out to use the
    global providers, which ``configure_telemetry`` installs. The content switch is read from
    the environment when not given.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        logger_provider: LoggerProvider | None = None,
        capture: CaptureMode | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
    ) -> None:
        self.tracer_provider = tracer_provider
        #: The model price table (LEDGERLOOP_MODEL_PRICES) the cost metric is counted by;
        #: the worker sets the default's from its settings.
        self.prices: Mapping[str, ModelPrice] = dict(prices or {})
        self.tracer = trace.get_tracer(
            sc.SCOPE_NAME, __version__, tracer_provider, schema_url=sc.SCHEMA_URL
        )
        meter = get_meter(sc.SCOPE_NAME, __version__, meter_provider, schema_url=sc.SCHEMA_URL)
        self.instruments = Instruments(meter)
        self.logger = get_logger(
            sc.SCOPE_NAME, __version__, logger_provider, schema_url=sc.SCHEMA_URL
        )
        self.capture = capture_mode_from_env() if capture is None else capture


_default: Telemetry | None = None
_default_lock = threading.Lock()
#: Set when a caller installed its own Telemetry (tests, embedders): global provider
#: configuration must not replace it.
_explicit = False


def get_telemetry() -> Telemetry:
    """The process-wide default, built on first use from the global providers."""
    global _default
    current = _default  # read once: every span asks, so skip the lock when already built
    if current is not None:
        return current
    with _default_lock:
        if _default is None:
            _default = Telemetry()
        return _default


def set_telemetry(telemetry: Telemetry | None) -> None:
    """Replace the default (``None``: rebuild from the globals on next use)."""
    global _default, _explicit
    with _default_lock:
        _default = telemetry
        _explicit = telemetry is not None


def reset_default_telemetry() -> None:
    """Rebuild the default from the globals on next use, unless one was set explicitly."""
    global _default
    with _default_lock:
        if not _explicit:
            _default = None


# --- shared span plumbing


def _elapsed_s(start_ns: int, end_ns: int) -> float:
    # Span and metric use the same two timestamps so the metric equals the span duration.
    return max(end_ns - start_ns, 0) / 1e9


def _set_error(span: Span, error_type: str, description: str) -> None:
    span.set_attribute(sc.ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, description[:_MAX_DESCRIPTION] or None))


def _exception_type(exc: BaseException) -> str:
    return type(exc).__name__


# --- invoke_agent


class AgentInvocation:
    """One ``invoke_agent`` span and what ran under it.

    ``span_context`` is what to persist (``span_context_to_dict``) so a resumed execution of the
    run can link back to this one.
    """

    def __init__(self, span: Span, agent_name: str) -> None:
        self.span = span
        self.agent_name = agent_name
        self.inference_calls = 0
        self.tool_calls = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self._usage_seen = False
        self.hibernated = False
        #: A durable run's conversation and tenant, put on its chat and tool spans.
        self.conversation_id: str | None = None
        self.tenant_id: str | None = None

    @property
    def span_context(self) -> SpanContext:
        return self.span.get_span_context()

    def name_agent(self, agent_name: str) -> None:
        """Name the agent once it is known (a durable run learns it from its first step)."""
        self.agent_name = agent_name
        self.span.update_name(sc.agent_span_name(agent_name))
        self.span.set_attribute(sc.GEN_AI_AGENT_NAME, agent_name)

    def _add_usage(self, input_tokens: int, output_tokens: int) -> None:
        self._usage_seen = True
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens


_current_agent: ContextVar[AgentInvocation | None] = ContextVar(
    "ledgerloop_current_agent", default=None
)


def mark_hibernated() -> None:
    """The current execution ends because its run hibernates: not an error, the run waits on."""
    invocation = _current_agent.get()
    if invocation is not None:
        invocation.hibernated = True
        invocation.span.set_attribute(sc.LEDGERLOOP_RUN_HIBERNATED, True)


@contextmanager
def agent_span(
    agent_name: str,
    run_id: str,
    *,
    links: Sequence[SpanContext] = (),
    request_model: str | None = None,
    tenant_id: str | None = None,
    telemetry: Telemetry | None = None,
) -> Iterator[AgentInvocation]:
    """Open ``invoke_agent {agent_name}`` (INTERNAL) around one execution of a run.

    ``links``: span contexts of earlier executions of the same run (a run resumed after a crash
    or a long wait starts a new trace and links to its past). Invalid contexts are skipped.
    ``request_model``: set only when the agent is bound to one model (spec rule).

    On exit records ``gen_ai.invoke_agent.duration`` and the inference/tool call counts. An
    exception marks the span ERROR with ``error.type`` = its class name and propagates.
    """
    tel = telemetry or get_telemetry()
    attrs: Attrs = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
        sc.LEDGERLOOP_RUN_ID: run_id,
    }
    if agent_name:
        attrs[sc.GEN_AI_AGENT_NAME] = agent_name
    if request_model:
        attrs[sc.GEN_AI_REQUEST_MODEL] = request_model
    if tenant_id:
        attrs[sc.LEDGERLOOP_TENANT_ID] = tenant_id
    start_ns = time.time_ns()
    span = tel.tracer.start_span(
        sc.agent_span_name(agent_name),
        kind=SpanKind.INTERNAL,
        attributes=attrs,  # at creation: samplers see them
        links=[Link(ctx) for ctx in links if ctx.is_valid],
        start_time=start_ns,
    )
    invocation = AgentInvocation(span, agent_name)
    error_type: str | None = None
    token = _current_agent.set(invocation)
    try:
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield invocation
    except BaseException as exc:
        if not invocation.hibernated:
            error_type = _exception_type(exc)
            _set_error(span, error_type, str(exc))
        raise
    finally:
        _current_agent.reset(token)
        if invocation._usage_seen:
            span.set_attributes(
                {
                    sc.GEN_AI_USAGE_INPUT_TOKENS: invocation.input_tokens,
                    sc.GEN_AI_USAGE_OUTPUT_TOKENS: invocation.output_tokens,
                }
            )
        end_ns = time.time_ns()
        _record_agent_metrics(tel, invocation, request_model, error_type, start_ns, end_ns)
        span.end(end_time=end_ns)


def _record_agent_metrics(
    tel: Telemetry,
    invocation: AgentInvocation,
    request_model: str | None,
    error_type: str | None,
    start_ns: int,
    end_ns: int,
) -> None:
    counts: Attrs = {sc.GEN_AI_AGENT_NAME: invocation.agent_name} if invocation.agent_name else {}
    duration = dict(counts)
    if request_model:
        duration[sc.GEN_AI_REQUEST_MODEL] = request_model
    if error_type:
        duration[sc.ERROR_TYPE] = error_type
    ins = tel.instruments
    ins.invoke_agent_duration.record(_elapsed_s(start_ns, end_ns), duration)
    ins.invoke_agent_inference_calls.record(invocation.inference_calls, counts)
    ins.invoke_agent_tool_calls.record(invocation.tool_calls, counts)


# --- chat


def usage_tokens(usage: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """(input, output) tokens of an Anthropic `usage`, input counted as the conventions want
    (cached tokens included: Anthropic's input_tokens leaves them out); None when either
    count is missing."""
    if not isinstance(usage, Mapping):
        return None
    inp = _token_count(usage.get("input_tokens"))
    out = _token_count(usage.get("output_tokens"))
    if inp is None or out is None:
        return None
    cache_read = _token_count(usage.get("cache_read_input_tokens"))
    cache_write = _token_count(usage.get("cache_creation_input_tokens"))
    return inp + (cache_read or 0) + (cache_write or 0), out


def _token_count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ChatRecorder:
    """Handle for one ``chat`` span: feed it the model's response (and, opt-in, the content)."""

    def __init__(self, span: Span, telemetry: Telemetry, attrs: Attrs) -> None:
        self.span = span
        self._tel = telemetry
        # Everything set on the span, kept for the metrics and the content event.
        self._attrs = attrs
        self._usage: tuple[int, int] | None = None
        self._content: dict[str, Any] | None = None
        self.error_type: str | None = None

    def record_error(self, error_type: str, message: str) -> None:
        """The call failed and the caller handles it without raising (a failure returned as
        data): marks the span ERROR and puts ``error.type`` on the duration metric too."""
        self.error_type = error_type
        _set_error(self.span, error_type, message)

    def record_response(self, resp: Mapping[str, Any]) -> None:
        """Take an Anthropic Messages response in dict form (``model_dump()`` of the SDK's)."""
        update: Attrs = {}
        if resp.get("id"):
            update[sc.GEN_AI_RESPONSE_ID] = str(resp["id"])
        if resp.get("model"):
            update[sc.GEN_AI_RESPONSE_MODEL] = str(resp["model"])
        if resp.get("stop_reason"):
            update[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [
                content.finish_reason(str(resp["stop_reason"]))
            ]
        usage = resp.get("usage")
        if isinstance(usage, Mapping):
            update.update(self._usage_attributes(usage))
        self._attrs.update(update)
        self.span.set_attributes(update)

    def _usage_attributes(self, usage: Mapping[str, Any]) -> Attrs:
        counted = usage_tokens(usage)
        if counted is None:
            return {}  # the spec forbids reporting counts we could not obtain
        total_in, out = counted
        cache_read = _token_count(usage.get("cache_read_input_tokens"))
        cache_write = _token_count(usage.get("cache_creation_input_tokens"))
        self._usage = (total_in, out)
        attrs: Attrs = {sc.GEN_AI_USAGE_INPUT_TOKENS: total_in, sc.GEN_AI_USAGE_OUTPUT_TOKENS: out}
        if cache_read is not None:
            attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = cache_read
        if cache_write is not None:
            attrs[sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] = cache_write
        return attrs

    def record_content(
        self,
        input_messages: Sequence[Mapping[str, Any]],
        output_message: Mapping[str, Any] | None,
        system: str | Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Keep the conversation for the opt-in details event; a no-op unless capture is on.

        Takes Anthropic shapes: the request ``messages``, the response (or assistant message;
        None for a call that failed: the event then has the request and the error) and the
        request ``system``. Content never lands on the span, in any mode.
        """
        if not self._tel.capture.emits_event:
            return
        reasons = self._attrs.get(sc.GEN_AI_RESPONSE_FINISH_REASONS)
        default_reason = reasons[0] if isinstance(reasons, list) and reasons else None
        captured: dict[str, Any] = {
            sc.GEN_AI_INPUT_MESSAGES: content.input_messages(input_messages),
        }
        if output_message is not None:
            captured[sc.GEN_AI_OUTPUT_MESSAGES] = content.output_messages(
                output_message, default_reason
            )
        if system:
            captured[sc.GEN_AI_SYSTEM_INSTRUCTIONS] = content.system_instructions(system)
        self._content = captured

    def _finish(self, error_type: str | None, start_ns: int, end_ns: int) -> None:
        metric_attrs: Attrs = {
            key: value
            for key, value in self._attrs.items()
            if key in _CHAT_METRIC_KEYS and value is not None
        }
        ins = self._tel.instruments
        if self._usage is not None:
            for token_type, count in zip(
                (sc.TOKEN_TYPE_INPUT, sc.TOKEN_TYPE_OUTPUT), self._usage, strict=True
            ):
                ins.client_token_usage.record(
                    count, {**metric_attrs, sc.GEN_AI_TOKEN_TYPE: token_type}
                )
            model = metric_attrs.get(sc.GEN_AI_RESPONSE_MODEL) or metric_attrs.get(
                sc.GEN_AI_REQUEST_MODEL
            )
            cost = cost_usd(self._tel.prices, str(model) if model else None, *self._usage)
            if cost is not None:
                ins.model_cost.add(cost, metric_attrs)
        if error_type:
            metric_attrs[sc.ERROR_TYPE] = error_type
        ins.client_operation_duration.record(_elapsed_s(start_ns, end_ns), metric_attrs)
        if self._content is not None:
            self._emit_details(error_type, end_ns)

    def _emit_details(self, error_type: str | None, end_ns: int) -> None:
        attrs: dict[str, Any] = dict(self._attrs)
        if error_type:
            attrs[sc.ERROR_TYPE] = error_type
        attrs.update(self._content or {})
        self._tel.logger.emit(
            # The event happened when the call ended; observed now (the same moment here).
            timestamp=end_ns,
            observed_timestamp=time.time_ns(),
            event_name=sc.EVENT_INFERENCE_DETAILS,
            severity_number=SeverityNumber.INFO,
            attributes=attrs,
            context=trace.set_span_in_context(self.span),
        )


# Low-cardinality attributes the conventions list for the client metrics; run and step ids stay
# on spans only.
_CHAT_METRIC_KEYS = frozenset(
    {
        sc.GEN_AI_OPERATION_NAME,
        sc.GEN_AI_PROVIDER_NAME,
        sc.GEN_AI_REQUEST_MODEL,
        sc.GEN_AI_RESPONSE_MODEL,
        sc.SERVER_ADDRESS,
        sc.SERVER_PORT,
    }
)


@contextmanager
def chat_span(
    request_model: str,
    *,
    server_address: str | None,
    server_port: int | None,
    run_id: str,
    step_name: str,
    provider: str = sc.PROVIDER_ANTHROPIC,
    max_tokens: int | None = None,
    telemetry: Telemetry | None = None,
) -> Iterator[ChatRecorder]:
    """Open ``chat {request_model}`` (CLIENT) around one model call, retries included.

    Open it only when the model is really called: never for a think step answered from the
    journal on replay. Counts as one inference call of the enclosing ``agent_span``, failed or
    not. On exit records ``gen_ai.client.operation.duration`` and, when ``record_response`` saw
    usage, ``gen_ai.client.token.usage``; with content capture on, emits the details event.
    """
    tel = telemetry or get_telemetry()
    attrs: Attrs = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
        sc.GEN_AI_PROVIDER_NAME: provider,
        sc.GEN_AI_REQUEST_MODEL: request_model,
        sc.LEDGERLOOP_RUN_ID: run_id,
        sc.LEDGERLOOP_STEP_NAME: step_name,
    }
    if server_address:
        attrs[sc.SERVER_ADDRESS] = server_address
        if server_port is not None:
            attrs[sc.SERVER_PORT] = server_port
    if max_tokens is not None:
        attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    invocation = _current_agent.get()
    if invocation is not None:
        invocation.inference_calls += 1
        if invocation.conversation_id:
            attrs[sc.GEN_AI_CONVERSATION_ID] = invocation.conversation_id
        if invocation.tenant_id:
            attrs[sc.LEDGERLOOP_TENANT_ID] = invocation.tenant_id
    start_ns = time.time_ns()
    span = tel.tracer.start_span(
        sc.chat_span_name(request_model),
        kind=SpanKind.CLIENT,
        attributes=attrs,
        start_time=start_ns,
    )
    recorder = ChatRecorder(span, tel, dict(attrs))
    error_type: str | None = None
    try:
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield recorder
    except BaseException as exc:
        error_type = _exception_type(exc)
        _set_error(span, error_type, str(exc))
        raise
    finally:
        if invocation is not None and recorder._usage is not None:
            invocation._add_usage(*recorder._usage)
        end_ns = time.time_ns()
        recorder._finish(error_type or recorder.error_type, start_ns, end_ns)
        span.end(end_time=end_ns)


# --- empty turns


def empty_turn(agent_name: str, request_model: str, *, telemetry: Telemetry | None = None) -> None:
    """Count a model turn that returned neither text nor a tool call (paid for, no progress).

    Like the spans, call it only for a turn the model really produced, not for a replayed one.
    """
    attrs: Attrs = {sc.GEN_AI_REQUEST_MODEL: request_model}
    if agent_name:
        attrs[sc.GEN_AI_AGENT_NAME] = agent_name
    (telemetry or get_telemetry()).instruments.empty_turns.add(1, attrs)


def run_swept(reason: str, *, telemetry: Telemetry | None = None) -> None:
    """Count a run the sweeper settled, by the reason it gave."""
    attrs: Attrs = {sc.LEDGERLOOP_RUN_SWEEP_REASON: reason}
    (telemetry or get_telemetry()).instruments.runs_swept.add(1, attrs)


# --- persisting span contexts for links


def span_context_to_dict(ctx: SpanContext) -> dict[str, str]:
    """A span context as hex strings, for the run state jsonb; ``{}`` if it is not valid
    (telemetry off), which ``span_context_from_dict`` reads back as invalid and links skip."""
    if not ctx.is_valid:
        return {}
    return {
        "trace_id": trace.format_trace_id(ctx.trace_id),
        "span_id": trace.format_span_id(ctx.span_id),
        "trace_flags": f"{int(ctx.trace_flags):02x}",
    }


def span_context_from_dict(data: Mapping[str, str]) -> SpanContext:
    """Inverse of ``span_context_to_dict``. Raises ValueError on malformed ids."""
    if not data:
        return INVALID_SPAN_CONTEXT
    try:
        trace_id = int(data["trace_id"], 16)
        span_id = int(data["span_id"], 16)
        flags = int(data.get("trace_flags", "01"), 16)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a persisted span context: {dict(data)!r}") from exc
    ctx = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    if not ctx.is_valid:
        raise ValueError(f"not a valid span context: {dict(data)!r}")
    return ctx
