"""The executions of a run: each one's span under the run's root, a killed one's span rebuilt
by its successor (with the model call it lost), and the waits between them.

See ``ledgerloop.telemetry.runtrace`` for the tree and why it is built this way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from ledgerloop.telemetry import semconv as sc
from ledgerloop.telemetry.runtrace import (
    _SAMPLED,
    RunFacts,
    _flush,
    _start,
    end_run,
    new_span_id,
    root_context,
    run_trace_id,
    sampled,
)
from ledgerloop.telemetry.spans import (
    AgentInvocation,
    Attrs,
    Telemetry,
    _current_agent,
    _elapsed_s,
    _set_error,
    get_telemetry,
    usage_tokens,
)

#: The execution running in this task (set by execution_span).
_current_execution: ContextVar[Execution | None] = ContextVar(
    "ledgerloop_current_execution", default=None
)


@dataclass
class Predecessor:
    """The execution before this one, when it ended without ending its span (killed)."""

    span_id: int
    start_ns: int
    #: Journal position and time of its last checkpoint.
    journal_end: int
    last_checkpoint_ns: int | None


@dataclass
class Execution:
    """One execution of a run, from before its first step: ids, facts, counts, losses."""

    run_id: str
    span_id: int = field(default_factory=new_span_id)
    start_ns: int = field(default_factory=time.time_ns)
    #: Journal entries that existed when this execution started (0 for the first one): an
    #: operation with a higher id really ran here, a lower one was answered by the journal.
    journal_end: int = 0
    resumed: bool = False
    predecessor: Predecessor | None = None
    #: Journaled model and tool calls of the whole run (replayed ones included): the root's
    #: call counts. The loop increments them in workflow code.
    inference_calls: int = 0
    tool_calls: int = 0
    #: Likewise the run's tokens (the root's gen_ai.usage.*): counted from journaled responses.
    input_tokens: int = 0
    output_tokens: int = 0
    facts: RunFacts | None = None
    invocation: AgentInvocation | None = None
    sampled: bool = True
    #: Its span already ended (a hibernation ends it before parking the run).
    ended: bool = False

    @property
    def trace_id(self) -> int:
        return run_trace_id(self.run_id)

    def token(self) -> dict[str, Any]:
        """What the run's first step journals about the first execution (its identity)."""
        return {
            "trace_id": f"{self.trace_id:032x}",
            "span_id": f"{self.span_id:016x}",
            "start_ns": self.start_ns,
        }

    def record(self) -> dict[str, Any]:
        """What a resumed execution stores in ``agent_run.execution`` when it takes over."""
        return {"span_id": f"{self.span_id:016x}", "start_ns": self.start_ns}


def current_execution() -> Execution | None:
    return _current_execution.get()


def predecessor_from(
    first: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    journal_end: int,
    last_checkpoint_ms: int | None,
) -> Predecessor | None:
    """The interrupted execution before this one, if any.

    ``first``: the first execution's token from the journal. ``previous``: what
    ``agent_run.execution`` held (None if no resumed execution ever took over). An ``end``
    there means that execution ended its own span (hibernated, stopped).
    """
    if previous and previous.get("end"):
        return None
    source = previous or first
    try:
        span_id = int(str(source["span_id"]), 16)
        start_ns = int(source["start_ns"])
    except (KeyError, TypeError, ValueError):
        return None  # journaled before executions were recorded: nothing to rebuild
    checkpoint = last_checkpoint_ms * 1_000_000 if last_checkpoint_ms is not None else None
    return Predecessor(span_id, start_ns, journal_end, checkpoint)


@contextmanager
def execution_span(
    execution: Execution, facts: RunFacts, *, telemetry: Telemetry | None = None
) -> Iterator[AgentInvocation]:
    """Open ``execution {agent}`` (its start is the execution's, before the first step) under
    the run's root, after emitting an interrupted predecessor. Chat and tool spans opened
    inside are its children; the agent, conversation and tenant are on it from the start.

    Ends it on return or error. On cancellation (a hibernation or a worker stop) it ends with
    ``ledgerloop.execution.end`` = hibernated / stopped: the process records that it ended
    (the park, or the stop's requeue), so the next execution does not rebuild it.
    """
    tel = telemetry or get_telemetry()
    execution.facts = facts
    execution.sampled = sampled(tel, execution.trace_id)
    root = root_context(execution.run_id, sampled=execution.sampled)
    if execution.predecessor is not None:
        _emit_interrupted(tel, execution, facts, root)
    attrs = facts.attributes()
    attrs[sc.GEN_AI_OPERATION_NAME] = sc.OPERATION_INVOKE_AGENT
    if execution.resumed:
        attrs[sc.LEDGERLOOP_EXECUTION_RESUMED] = True
    span = _start(
        tel,
        sc.execution_span_name(facts.agent),
        trace_id=execution.trace_id,
        span_id=execution.span_id,
        parent=root,
        attributes=attrs,
        start_time=execution.start_ns,
    )
    invocation = AgentInvocation(span, facts.agent)
    invocation.conversation_id = facts.conversation_id
    invocation.tenant_id = facts.tenant_id
    execution.invocation = invocation
    agent_token = _current_agent.set(invocation)
    exec_token = _current_execution.set(execution)
    end = "completed"
    try:
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield invocation
    except BaseException as exc:
        if invocation.hibernated:
            end = "hibernated"
        elif isinstance(exc, asyncio.CancelledError):
            end = "stopped"
        else:
            end = "failed"
            _set_error(span, type(exc).__name__, str(exc))
        raise
    finally:
        _current_execution.reset(exec_token)
        _current_agent.reset(agent_token)
        if invocation._usage_seen:  # this execution's model calls, in total
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, invocation.input_tokens)
            span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, invocation.output_tokens)
        if not execution.ended:
            span.set_attribute(sc.LEDGERLOOP_EXECUTION_END, end)
            span.end()


def end_hibernating_execution() -> Execution | None:
    """End the current execution's span now, as hibernated, and return the execution.

    The park that follows records that this execution ended its own span; the span must be
    out of the process before that record commits, or a crash in between would leave a run
    whose executions nobody emits. Follow with ``flush`` (off the event loop).
    """
    execution = _current_execution.get()
    if execution is None or execution.invocation is None or execution.ended:
        return None
    invocation = execution.invocation
    span = invocation.span
    if invocation._usage_seen:
        span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, invocation.input_tokens)
        span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, invocation.output_tokens)
    span.set_attribute(sc.LEDGERLOOP_RUN_HIBERNATED, True)
    span.set_attribute(sc.LEDGERLOOP_EXECUTION_END, "hibernated")
    span.end()
    execution.ended = True
    return execution


def flush(telemetry: Telemetry | None = None) -> None:
    """Export what the tracer provider holds (blocking; at most 2 s)."""
    _flush(telemetry or get_telemetry())


def _emit_interrupted(
    tel: Telemetry, execution: Execution, facts: RunFacts, root: SpanContext
) -> None:
    """The predecessor's span, emitted by its successor: from its start to the takeover."""
    before = execution.predecessor
    assert before is not None
    attrs = facts.attributes()
    attrs[sc.GEN_AI_OPERATION_NAME] = sc.OPERATION_INVOKE_AGENT
    attrs[sc.LEDGERLOOP_EXECUTION_END] = "interrupted"
    span = _start(
        tel,
        sc.execution_span_name(facts.agent),
        trace_id=execution.trace_id,
        span_id=before.span_id,
        parent=root,
        attributes=attrs,
        start_time=before.start_ns,
    )
    _set_error(
        span,
        sc.ERROR_EXECUTION_INTERRUPTED,
        "the process running this execution ended without finishing it (killed or stopped "
        "mid-step); the run resumed from its last checkpoint",
    )
    if before.last_checkpoint_ns is not None:
        span.add_event("last_checkpoint", timestamp=before.last_checkpoint_ns)
    span.end(end_time=max(execution.start_ns, before.start_ns))


def lost_call(
    step_id: int | None,
    request_model: str,
    *,
    step_name: str,
    server_address: str | None,
    server_port: int | None,
    max_tokens: int | None = None,
    telemetry: Telemetry | None = None,
) -> None:
    """Report the model call an interrupted predecessor had in flight, if this think step is
    the one it died in (the first operation after the journal's end). Call it from the think
    step's body, which runs only when the step is not answered from the journal."""
    execution = _current_execution.get()
    if execution is None or execution.predecessor is None or execution.facts is None:
        return
    before = execution.predecessor
    if step_id is None or step_id != before.journal_end + 1:
        return
    execution.predecessor = None  # one report per takeover
    tel = telemetry or get_telemetry()
    facts = execution.facts
    attrs: Attrs = {
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
        sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_ANTHROPIC,
        sc.GEN_AI_REQUEST_MODEL: request_model,
        sc.LEDGERLOOP_RUN_ID: facts.run_id,
        sc.LEDGERLOOP_STEP_NAME: step_name,
        sc.LEDGERLOOP_CALL_LOST: True,
    }
    if facts.conversation_id:
        attrs[sc.GEN_AI_CONVERSATION_ID] = facts.conversation_id
    if server_address:
        attrs[sc.SERVER_ADDRESS] = server_address
        if server_port is not None:
            attrs[sc.SERVER_PORT] = server_port
    if max_tokens is not None:  # the same request as the call that replaces it
        attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    parent = SpanContext(
        execution.trace_id,
        before.span_id,
        is_remote=True,
        trace_flags=_SAMPLED if execution.sampled else TraceFlags(TraceFlags.DEFAULT),
    )
    start = before.last_checkpoint_ns or before.start_ns
    span = _start(
        tel,
        sc.chat_span_name(request_model),
        trace_id=execution.trace_id,
        span_id=new_span_id(),
        parent=parent,
        kind=SpanKind.CLIENT,
        attributes=attrs,
        start_time=start,
    )
    _set_error(
        span,
        sc.ERROR_EXECUTION_INTERRUPTED,
        "the process died during this model call: the request may have been sent (and "
        "billed) but its answer was never journaled; the step ran again",
    )
    span.end(end_time=max(execution.start_ns, start))
    metric: Attrs = {sc.GEN_AI_REQUEST_MODEL: request_model, sc.GEN_AI_AGENT_NAME: facts.agent}
    tel.instruments.lost_calls.add(1, metric)


def replayed(function_id: int | None) -> bool:
    """Whether the workflow operation with this id was answered by the journal here."""
    execution = _current_execution.get()
    return execution is None or function_id is None or function_id <= execution.journal_end


def wait_span(
    kind: str,
    tool_name: str,
    *,
    started_at: float,
    ended_at: float,
    approval_id: str | None = None,
    decision: str | None = None,
    idempotency_key: str | None = None,
    effect_status: str | None = None,
    error_type: str | None = None,
    telemetry: Telemetry | None = None,
) -> None:
    """Emit ``await_{kind} {tool}`` under the run's root, for a wait that ended in this
    execution (the caller checks ``replayed``). Times are epoch seconds."""
    execution = _current_execution.get()
    if execution is None or execution.facts is None:
        return
    tel = telemetry or get_telemetry()
    start_ns, end_ns = int(started_at * 1e9), int(max(ended_at, started_at) * 1e9)
    attrs = execution.facts.attributes()
    attrs[sc.LEDGERLOOP_WAIT_KIND] = kind
    attrs[sc.GEN_AI_TOOL_NAME] = tool_name
    attrs[sc.LEDGERLOOP_WAIT_DURATION] = _elapsed_s(start_ns, end_ns)
    if approval_id:
        attrs[sc.LEDGERLOOP_APPROVAL_ID] = approval_id
    if decision:
        attrs[sc.LEDGERLOOP_APPROVAL_DECISION] = decision
    if idempotency_key:
        attrs[sc.LEDGERLOOP_EFFECT_IDEMPOTENCY_KEY] = idempotency_key
    if effect_status:
        attrs[sc.LEDGERLOOP_EFFECT_STATUS] = effect_status
    root = root_context(execution.run_id, sampled=execution.sampled)
    span = _start(
        tel,
        sc.wait_span_name(kind, tool_name),
        trace_id=execution.trace_id,
        span_id=new_span_id(),
        parent=root,
        attributes=attrs,
        start_time=start_ns,
    )
    if error_type:
        _set_error(span, error_type, f"the wait ended {error_type}")
    span.end(end_time=end_ns)


def end_run_here(
    status: str, reason: str, facts: RunFacts, usage: Mapping[str, Any] | None = None
) -> None:
    """``end_run`` from a step body, with the run's call counts and tokens when this execution
    has them. ``usage``: the model call of the step that ends the run (not counted yet: the
    workflow counts a step's tokens once it returned)."""
    execution = _current_execution.get()
    if execution is not None and execution.run_id == facts.run_id:
        tokens = (execution.input_tokens, execution.output_tokens)
        this_step = usage_tokens(usage)
        if this_step is not None:
            tokens = (tokens[0] + this_step[0], tokens[1] + this_step[1])
        end_run(
            status,
            reason,
            facts=facts,
            inference_calls=execution.inference_calls,
            tool_calls=execution.tool_calls,
            usage=tokens,
        )
    else:
        end_run(status, reason, facts=facts)


def count_tokens(usage: Mapping[str, Any] | None) -> None:
    """A journaled model response's usage, counted toward the run's totals (workflow code:
    replays count too, so the execution that ends the run has the whole run's)."""
    execution = _current_execution.get()
    counted = usage_tokens(usage)
    if execution is None or counted is None:
        return
    execution.input_tokens += counted[0]
    execution.output_tokens += counted[1]
