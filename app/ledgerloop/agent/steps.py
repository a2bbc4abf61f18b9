"""The bodies of the loop's steps. Each runs at least once and is checkpointed by DBOS.

Inputs and outputs are plain JSON (DBOS's portable format), and every database write here is
idempotent, because a step that dies after its write and before its checkpoint runs again.
Spans open inside step bodies, so a step answered from the journal emits nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from dbos import DBOS
from pydantic import ValidationError

from ledgerloop.agent.definition import Agent, get_agent
from ledgerloop.agent.keep import keep
from ledgerloop.agent.memory import messages_load
from ledgerloop.agent.read_cache import READ_CACHE
from ledgerloop.agent.stepping import db_call, pooled_autocommit
from ledgerloop.agent.text_stream import current, told
from ledgerloop.db.connect import Conn
from ledgerloop.faults import hit
from ledgerloop.models.client import Tier
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.runs.store import Memory, RunStopped, run_ensure_status, run_facts
from ledgerloop.runtime import Runtime, get_runtime
from ledgerloop.telemetry import chat_span, empty_turn, tool_span
from ledgerloop.telemetry.executions import end_run_here, lost_call
from ledgerloop.telemetry.runtrace import end_run, trace_headers
from ledgerloop.tools.errors import NonRetryableToolError, RetryableToolError
from ledgerloop.tools.payloads import offload_if_large
from ledgerloop.tools.registry import ToolContext, ToolKind


def _require_agent(name: str) -> Agent:
    agent = get_agent(name)
    if agent is None:
        raise LookupError(f"agent {name!r} is not registered in this worker")
    return agent


# -- memory ------------------------------------------------------------------------------


@pooled_autocommit
def memory_load(conn: Conn, run_key: str, trace: dict[str, Any]) -> dict[str, Any]:
    rt = get_runtime()
    run_id = uuid.UUID(run_key)
    now = time.time()
    # The move to planning first: it returns the run, so the common case is one statement.
    # The deadline goes into the run's state too: the sweeper settles a run still unfinished
    # past it (control/sweeper.py).
    try:
        run = run_ensure_status(
            conn,
            run_id,
            RunStatus.PLANNING,
            "planning",
            {"turn": 0},
            {"deadline": now + rt.settings.run_deadline_s},
            step="memory-load",
        )
    except RunStopped as stopped:
        run = stopped.run
    base = {
        # The first execution's identity, journaled with this step: a resumed execution
        # replays it (and rebuilds that execution's span if it was killed), at no extra cost.
        "trace": trace,
        "agent": run.agent,
        "tenant_id": str(run.tenant_id),
        "created_ns": int(run.created_at.timestamp() * 1e9),
        "now": now,
        # A repeat of this step (its first execution died before its checkpoint) keeps the
        # deadline the first one recorded.
        "deadline": float(run.state.get("deadline") or now + rt.settings.run_deadline_s),
    }
    if run.status in TERMINAL:
        return {**base, "terminal": run.status.value, "messages": []}
    agent = get_agent(run.agent)
    if agent is None:
        run_ensure_status(
            conn,
            run_id,
            RunStatus.FAILED,
            "failed",
            {"reason": "unknown_agent"},
            {"error": f"agent {run.agent!r} is not registered in this worker"},
        )
        end_run("failed", "unknown_agent", facts=run_facts(run))
        return {**base, "terminal": "failed", "messages": []}
    given = run.input.get("conversation_id")
    conversation_id = str(given or run_id)
    # A conversation of the run's own (none was given) has no history: its id is new.
    history = (
        messages_load(conn, tenant_id=run.tenant_id, conversation_id=conversation_id)
        if given
        else []
    )
    user_text = agent.user_message(run.input)
    return {
        **base,
        "conversation_id": conversation_id,
        "history_len": len(history),
        "messages": [*history, {"role": "user", "content": user_text}],
        # Journaled: this run's read-only turns run their tools in the next think step. A run
        # whose memory-load lacks it started under an older loop and keeps a step per read.
        "reads_in_think": True,
        # Journaled likewise: this run's turns of reads and plain writes ride the next think
        # step (agent.turn_tools); an older run keeps a step per write.
        "writes_in_think": True,
        # The budgets every agent and child episode of the run spends from (agent.budgets),
        # journaled so a resumed run keeps the ones it began with.
        "budget": {
            "iterations": rt.settings.max_iterations,
            "tokens": rt.settings.max_run_tokens,
        },
    }


@pooled_autocommit
def memory_save(
    conn: Conn,
    run_id: str,
    tenant_id: str,
    conversation_id: str,
    turn: int,
    first_sequence: int,
    messages: list[dict[str, Any]],
    target: str,
    event: str,
    event_payload: dict[str, Any],
    state_patch: dict[str, Any],
) -> dict[str, Any]:
    """Append the turn's messages; they and the run's next status commit together."""
    run = run_ensure_status(
        conn,
        uuid.UUID(run_id),
        RunStatus(target),
        event,
        event_payload,
        state_patch,
        step=f"memory-save-{turn}",
        memory=Memory(conversation_id, first_sequence, messages),
    )
    if run.status is RunStatus.SUCCEEDED:
        end_run_here(run.status.value, event, run_facts(run))  # after the commit: the root
    return {"status": run.status.value, "now": time.time()}


@pooled_autocommit
def finish(
    conn: Conn,
    run_id: str,
    target: str,
    event: str,
    payload: dict[str, Any],
    memory: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Move the run to a terminal status with the reason in its state and history, and save
    the conversation not yet in memory (`memory`: tenant, conversation, first sequence and
    messages) in the same statement."""
    saved = (
        Memory(memory["conversation_id"], memory["first_sequence"], memory["messages"])
        if memory
        else None
    )
    run = run_ensure_status(
        conn,
        uuid.UUID(run_id),
        RunStatus(target),
        event,
        payload,
        payload,
        step="finish",
        memory=saved,
    )
    end_run_here(run.status.value, event, run_facts(run))  # after the commit: the root span
    return {"status": run.status.value}


@pooled_autocommit
def transition(
    conn: Conn,
    run_id: str,
    target: str,
    event: str,
    payload: dict[str, Any],
    step: str | None = None,
) -> dict[str, Any]:
    """A bare status move, for waits (awaiting_approval, reconciling); `step` records a
    same-state event (another reconciling round) once.

    Autocommit: the move is one statement (run_advance; a read follows only when it did not
    move), so a BEGIN and a COMMIT would only add two round trips, each of which a thread
    may wait for the interpreter to get back (this runs beside the step's model call)."""
    run = run_ensure_status(conn, uuid.UUID(run_id), RunStatus(target), event, payload, step=step)
    return {"status": run.status.value, "now": time.time()}


# -- think -------------------------------------------------------------------------------


def is_empty_turn(response: dict[str, Any]) -> bool:
    """A turn that produced nothing: no tool call and no visible text.

    Zero output tokens is not the test (the provider-side failure bills thousands of tokens
    and returns nothing), and "no tool call" alone is not either (prose answers are fine).
    """
    for block in response.get("content") or []:
        if block.get("type") == "tool_use":
            return False
        if block.get("type") == "text" and str(block.get("text", "")).strip():
            return False
    return True


async def think(
    run_id: str,
    step_name: str,
    agent_name: str,
    tier: str,
    messages: list[dict[str, Any]],
    mcp_tools: list[dict[str, Any]] | None = None,
    replan: bool = False,
    save: dict[str, Any] | None = None,
    reads: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One messages.create. Failures come back as data: the workflow decides what they mean.

    `replan`: the run comes back from a write turn; move it to planning in this step
    (recorded once under the step's name), rather than in a step of its own.
    `save`: the run's final save, for when the model answers (see `save_answer`).
    `reads`: the previous turn ({"message": its assistant message, "tenant_id"}) asked only
    for read tools; they run here, before the model call, and their results are journaled
    with it (`reads` in the result). A read changes nothing outside, so running it again when
    this step is repeated costs a call and nothing else; the model call's window is as before.
    """
    # The move back to planning overlaps the reads and the model call (it commits before the
    # step returns, and before an answer is saved): it is this step's, and nothing in the
    # model call depends on it.
    moving = (
        asyncio.ensure_future(
            asyncio.to_thread(
                transition, run_id, RunStatus.PLANNING.value, "planning", {}, step_name
            )
        )
        if replan
        else None
    )
    try:
        result, save = await _ask(
            run_id, step_name, agent_name, tier, messages, mcp_tools, save, reads
        )
    finally:
        if moving is not None:
            await moving
    if save is not None and "response" in result and answer_text(result["response"]) is not None:
        result = await asyncio.to_thread(save_answer, run_id, save, result)
    return result


async def _ask(
    run_id: str,
    step_name: str,
    agent_name: str,
    tier: str,
    messages: list[dict[str, Any]],
    mcp_tools: list[dict[str, Any]] | None,
    save: dict[str, Any] | None,
    reads: dict[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The think step's reads and model call: its result, and the save with the reads."""
    read_results: dict[str, Any] = {}
    if reads is not None:
        results = [
            await run_read_tool(run_id, reads["tenant_id"], step_name, agent_name, call)
            for call in reads["message"]["content"]
            if call.get("type") == "tool_use"
        ]
        hit("think.after_reads")
        turn = [reads["message"], {"role": "user", "content": results}]
        messages = [*messages, *turn]
        if save is not None:
            save = {**save, "unsaved": [*save["unsaved"], *turn]}
        read_results = {"reads": results}
    rt = get_runtime()
    agent = _require_agent(agent_name)
    model = rt.model.model_for(Tier(tier))
    request = {
        "model": model,
        "max_tokens": agent.max_tokens,
        "system": agent.system,
        "messages": messages,
        "tools": [*(tool.schema() for tool in agent.tools), *(mcp_tools or ())],
    }
    # The call an interrupted execution had in flight here, if this is where it died.
    lost_call(
        DBOS.step_id,
        model,
        step_name=step_name,
        server_address=rt.model.server_address,
        server_port=rt.model.server_port,
        max_tokens=agent.max_tokens,
    )
    # The crash matrix's boundary "before the model call": the step (and its reads) ran up
    # to here and nothing was asked; a repeat must ask once.
    hit("think.before_model_call")
    with chat_span(
        model,
        server_address=rt.model.server_address,
        server_port=rt.model.server_port,
        run_id=run_id,
        step_name=step_name,
        max_tokens=agent.max_tokens,
    ) as recorder:
        # Kept for a retry of this step (agent.keep): the save after it failing on a
        # transient database error repeats the save, not the call.
        answer = await keep("model", lambda: _call_model(rt, request, run_id, step_name))
        if isinstance(answer, Exception):
            exc = answer
            error = {"type": type(exc).__name__, "message": str(exc)[:500]}
            status = getattr(exc, "status_code", None)
            if status is not None:
                error["status_code"] = status
            # Returned as data, so the span would not see it: mark it (span and metric).
            recorder.record_error(error["type"], error["message"])
            recorder.record_content(messages, None, agent.system)  # the request, no answer
            failed = {"error": error, "model": model, "tier": tier, "now": time.time()}
            return {**failed, **read_results}, save
        response = answer
        # How long the call waited for the fleet's model budget (models/limits.py): kept in
        # the step's result, where the timeline shows it.
        budget_wait = response.pop("rate_limit_wait_s", None)
        recorder.record_response(response)
        recorder.record_content(messages, response, agent.system)
    if is_empty_turn(response):
        empty_turn(agent.name, model)
    result: dict[str, Any] = {
        "response": compact_response(response),
        "model": model,
        "tier": tier,
        "now": time.time(),
        **read_results,
    }
    if budget_wait:
        result["budget_wait_s"] = budget_wait
    return result, save


async def _call_model(
    rt: Runtime, request: dict[str, Any], run_id: str, step_name: str
) -> dict[str, Any] | Exception:
    """The one messages.create of a think step: the response, or the error it raised (kept
    as well: a failed call is not asked again either, the step reports it).

    Streamed (settings.stream_text), its text deltas go to the run's subscribers as they
    arrive (agent.text_stream), never to the journal: the step records the whole message."""
    text = current(rt, run_id, step_name)
    try:
        # The chat span's context rides the request (W3C traceparent).
        response: dict[str, Any] = await rt.model.create(
            **request, on_text=None if text is None else text.write, extra_headers=trace_headers()
        )
    except Exception as exc:
        return exc
    finally:
        if text is not None:
            # Its last batch commits before the step records anything (TEXT_DRAIN_S at most).
            await text.drained(TEXT_DRAIN_S)
    return response


#: How long a think step waits for its streamed text's last write before it goes on.
TEXT_DRAIN_S = 1.0


def answer_text(response: dict[str, Any]) -> str | None:
    """The text of a response that is a final answer (no tool call, something visible)."""
    if is_empty_turn(response):
        return None
    content = response.get("content") or []
    if any(block.get("type") == "tool_use" for block in content):
        return None
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


@pooled_autocommit
def save_answer(
    conn: Conn, run_id: str, save: dict[str, Any], result: dict[str, Any]
) -> dict[str, Any]:
    """The run's final save, made by the think step that got the answer (the loop asks for it
    only when nothing can refuse the answer: no validator, no sandbox to destroy): the
    conversation not yet in memory, the answer and `succeeded`, in one statement, under the
    step name `memory-save-{turn}` the save would otherwise have had. Saves a step (its
    journal check and checkpoint) per run.

    A repeat of the step (it died after this commit, before its checkpoint) asked the model
    again; the answer that counts is the one saved: the result is made from it.
    """
    text = answer_text(result["response"])
    assert text is not None
    turn = int(save["turn"])
    answer = {"answer": text, "turns": turn + 1, "empty_turns": save["empty_turns"]}
    message = {"role": "assistant", "content": result["response"]["content"]}
    run = run_ensure_status(
        conn,
        uuid.UUID(run_id),
        RunStatus.SUCCEEDED,
        "succeeded",
        answer,
        {"turn": turn, **answer},
        step=f"memory-save-{turn}",
        memory=Memory(save["conversation_id"], save["first_sequence"], [*save["unsaved"], message]),
    )
    hit("loop.after_answer_saved")
    saved = run.state.get("answer")
    if isinstance(saved, str) and saved != text:
        content = [{"type": "text", "text": saved}]
        result = {**result, "response": {**result["response"], "content": content}}
    # After the commit: the root, with this step's tokens (the workflow counts them later).
    end_run_here(run.status.value, "succeeded", run_facts(run), result["response"].get("usage"))
    return {**result, "saved": run.status.value}


def compact_response(response: dict[str, Any]) -> dict[str, Any]:
    """What of a model response the run keeps in its journal: the content (null fields
    dropped: the SDK's JSON has a dozen per block), why it stopped, what it cost. The rest
    of the SDK object is mostly nulls, and each turn would write it to the journal again."""
    usage = response.get("usage") or {}
    return {
        "id": response.get("id"),
        "model": response.get("model"),
        "stop_reason": response.get("stop_reason"),
        "content": [
            {k: v for k, v in block.items() if v is not None}
            for block in response.get("content") or []
        ],
        "usage": {
            k: usage[k] for k in ("input_tokens", "output_tokens") if usage.get(k) is not None
        },
    }


# -- act: read tools ---------------------------------------------------------------------


def tool_result(call_id: str, content: str, *, is_error: bool = False) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


async def run_read_tool(
    run_id: str, tenant_id: str, step_name: str, agent_name: str, call: dict[str, Any]
) -> dict[str, Any]:
    """`_read_tool`, its call and result told to the run's live stream."""
    live = current(get_runtime(), run_id, step_name)
    return await told(live, call, _read_tool(run_id, tenant_id, step_name, agent_name, call))


async def _read_tool(
    run_id: str, tenant_id: str, step_name: str, agent_name: str, call: dict[str, Any]
) -> dict[str, Any]:
    """Validate, run with the policy's timeout and retries, offload a large result."""
    rt = get_runtime()
    agent = _require_agent(agent_name)
    call_id, name = str(call["id"]), str(call["name"])
    # A read tool leaves the run's status alone: it changes nothing outside, so "executing"
    # would only cost a write per turn (the step itself is in the journal and the timeline).
    tool = agent.tool(name)
    # An unknown name has no description of its own: the span says what ran instead.
    description = tool.description if tool is not None else f"unknown tool {name!r}"
    with tool_span(
        name, call_id, run_id=run_id, step_name=step_name, description=description
    ) as span:
        if tool is None:
            known = ", ".join(t.name for t in agent.tools)
            span.record_error("UnknownTool", f"unknown tool {name}")
            return tool_result(
                call_id, f"unknown tool {name!r}; known tools: {known}", is_error=True
            )
        try:
            args = tool.input_model.model_validate(call.get("input") or {})
        except ValidationError as exc:
            span.record_error("InvalidArguments", "arguments failed validation")
            return tool_result(call_id, f"invalid arguments for {name}: {exc}", is_error=True)
        if tool.kind is not ToolKind.READ or tool.handler is None:
            raise TypeError(f"{name} is not a read tool")
        policy = rt.policy.for_tool(name)
        ctx = ToolContext(run_id, call_id, tenant_id, f"{run_id}:{call_id}")
        cache_key = READ_CACHE.key(tenant_id, agent.name, name, call.get("input"))
        cached = READ_CACHE.get(cache_key) if policy.cache_ttl_s > 0 else None
        if cached is not None:
            output: Any = cached
        else:
            # Kept for a retry of this step (agent.keep): a transient failure after the
            # read (the offload, the step's later statements) does not read again.
            handler = tool.handler
            outcome = await keep(
                f"read {call_id}", lambda: _with_retries(handler, args, ctx, policy)
            )
            if outcome["error"] is not None:
                span.record_error(outcome["error"]["type"], outcome["error"]["message"])
                return tool_result(call_id, json.dumps(outcome["error"]), is_error=True)
            output = outcome["output"]
            if policy.cache_ttl_s > 0:
                READ_CACHE.put(cache_key, policy.cache_ttl_s, output)
        text = _as_text(output)
        # Most results are small: no connection, no thread hop (the UTF-8 size is at most
        # four bytes a character, so a short string needs no encoding to know it fits).
        limit = rt.settings.payload_offload_bytes
        if len(text) * 4 <= limit or len(text.encode()) <= limit:
            return tool_result(call_id, text)
        offloaded = await db_call(
            offload_if_large,
            text,
            limit_bytes=limit,
            run_id=uuid.UUID(run_id),
            tenant_id=uuid.UUID(tenant_id),
            tool_call_id=call_id,
        )
        result = tool_result(call_id, offloaded.visible)
        if offloaded.payload_id:
            result["payload_ref"] = offloaded.payload_id
        return result


async def _with_retries(handler: Any, args: Any, ctx: ToolContext, policy: Any) -> dict[str, Any]:
    """Retry retryable failures inside the step, within attempts and the policy deadline."""
    attempts = policy.max_retries + 1
    deadline = time.monotonic() + policy.deadline_s
    last: dict[str, Any] = {}
    for attempt in range(1, attempts + 1):
        try:
            output = await asyncio.wait_for(handler(args, ctx), policy.timeout_ms / 1000)
            return {"output": output, "error": None}
        except NonRetryableToolError as exc:
            return {"output": None, "error": {"type": type(exc).__name__, "message": str(exc)}}
        except (RetryableToolError, TimeoutError) as exc:
            last = {"type": type(exc).__name__, "message": str(exc) or "timed out"}
        backoff = min(0.1 * 2 ** (attempt - 1), 5.0)
        if attempt == attempts or time.monotonic() + backoff > deadline:
            break
        await asyncio.sleep(backoff)
    return {
        "output": None,
        "error": {
            "type": "RetryBudgetExhausted",
            "attempts": attempt,
            "last_error": last,
            "message": f"gave up after {attempt} attempts: {last.get('message')}",
        },
    }
