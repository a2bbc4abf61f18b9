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
from collections.abc import Callable
from functools import wraps
from typing import Any, Concatenate, ParamSpec, TypeVar

from dbos import StepOptions
from pydantic import ValidationError

from ledgerloop.agent.definition import Agent, get_agent
from ledgerloop.agent.memory import messages_append, messages_load
from ledgerloop.db.connect import Conn
from ledgerloop.models.client import Tier
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_ensure_status, run_require
from ledgerloop.runtime import get_runtime
from ledgerloop.telemetry import chat_span, empty_turn, tool_span
from ledgerloop.tools.errors import NonRetryableToolError, RetryableToolError
from ledgerloop.tools.payloads import offload_if_large
from ledgerloop.tools.registry import ToolContext, ToolKind

P = ParamSpec("P")
R = TypeVar("R")

#: Code steps (memory, bookkeeping): 3 attempts within about 30 s.
CODE_STEP: StepOptions = {"retries_allowed": True, "max_attempts": 3, "interval_seconds": 1.0}
#: A model call: one attempt (the client's own timeout bounds it at 240 s).
MODEL_STEP: StepOptions = {"retries_allowed": False}


async def db_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a sync store function on a pooled connection, off the event loop."""

    def call() -> Any:
        with get_runtime().pool.connection() as conn:
            return fn(conn, *args, **kwargs)

    return await asyncio.to_thread(call)


def pooled(fn: Callable[Concatenate[Conn, P], R]) -> Callable[P, R]:
    """A store function as a step body: it borrows a pooled connection for the call.

    DBOS runs a sync step body on its thread pool, so the event loop never blocks on it.
    """

    @wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with get_runtime().pool.connection() as conn:
            return fn(conn, *args, **kwargs)

    return call


def _require_agent(name: str) -> Agent:
    agent = get_agent(name)
    if agent is None:
        raise LookupError(f"agent {name!r} is not registered in this worker")
    return agent


# -- memory ------------------------------------------------------------------------------


@pooled
def memory_load(conn: Conn, run_key: str, trace: dict[str, str]) -> dict[str, Any]:
    rt = get_runtime()
    run_id = uuid.UUID(run_key)
    run = run_require(conn, run_id)
    base = {
        # The first execution's span context, journaled with this step: a resumed execution
        # replays it and links its own invoke_agent span to it, at no extra cost.
        "trace": trace,
        "agent": run.agent,
        "tenant_id": str(run.tenant_id),
        "now": time.time(),
        "deadline": time.time() + rt.settings.run_deadline_s,
    }
    if run.status.value in ("succeeded", "failed", "cancelled"):
        return {**base, "terminal": run.status.value, "messages": []}
    agent = get_agent(run.agent)
    if agent is None:
        with conn.transaction():
            run_ensure_status(
                conn,
                run_id,
                RunStatus.FAILED,
                "failed",
                {"reason": "unknown_agent"},
                {"error": f"agent {run.agent!r} is not registered in this worker"},
            )
        return {**base, "terminal": "failed", "messages": []}
    conversation_id = str(run.input.get("conversation_id") or run_id)
    history = messages_load(conn, tenant_id=run.tenant_id, conversation_id=conversation_id)
    message = run.input.get("message")
    user_text = message if isinstance(message, str) else json.dumps(run.input)
    run_ensure_status(conn, run_id, RunStatus.PLANNING, "planning", {"turn": 0})
    return {
        **base,
        "conversation_id": conversation_id,
        "history_len": len(history),
        "messages": [*history, {"role": "user", "content": user_text}],
    }


@pooled
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
    with conn.transaction():
        messages_append(
            conn,
            run_id=uuid.UUID(run_id),
            tenant_id=uuid.UUID(tenant_id),
            conversation_id=conversation_id,
            turn=turn,
            first_sequence=first_sequence,
            messages=messages,
        )
        run = run_ensure_status(
            conn, uuid.UUID(run_id), RunStatus(target), event, event_payload, state_patch
        )
    return {"status": run.status.value, "now": time.time()}


@pooled
def finish(
    conn: Conn, run_id: str, target: str, event: str, payload: dict[str, Any]
) -> dict[str, Any]:
    """Move the run to a terminal status with the reason in its state and history."""
    with conn.transaction():
        run = run_ensure_status(conn, uuid.UUID(run_id), RunStatus(target), event, payload, payload)
    return {"status": run.status.value}


@pooled
def transition(
    conn: Conn, run_id: str, target: str, event: str, payload: dict[str, Any]
) -> dict[str, Any]:
    """A bare status move, for waits (awaiting_approval, reconciling)."""
    with conn.transaction():
        run = run_ensure_status(conn, uuid.UUID(run_id), RunStatus(target), event, payload)
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
    run_id: str, step_name: str, agent_name: str, tier: str, messages: list[dict[str, Any]]
) -> dict[str, Any]:
    """One messages.create. Failures come back as data: the workflow decides what they mean."""
    rt = get_runtime()
    agent = _require_agent(agent_name)
    model = rt.model.model_for(Tier(tier))
    request = {
        "model": model,
        "max_tokens": agent.max_tokens,
        "system": agent.system,
        "messages": messages,
        "tools": [tool.schema() for tool in agent.tools],
    }
    with chat_span(
        model,
        server_address=rt.model.server_address,
        server_port=rt.model.server_port,
        run_id=run_id,
        step_name=step_name,
        max_tokens=agent.max_tokens,
    ) as recorder:
        try:
            response = await rt.model.create(**request)
        except Exception as exc:
            error = {"type": type(exc).__name__, "message": str(exc)[:500]}
            status = getattr(exc, "status_code", None)
            if status is not None:
                error["status_code"] = status
            return {"error": error, "model": model, "tier": tier, "now": time.time()}
        recorder.record_response(response)
        recorder.record_content(messages, response, agent.system)
    if is_empty_turn(response):
        empty_turn(agent.name, model)
    return {"response": response, "model": model, "tier": tier, "now": time.time()}


# -- act: read tools ---------------------------------------------------------------------


def tool_result(call_id: str, content: str, *, is_error: bool = False) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


async def run_read_tool(
    run_id: str, tenant_id: str, step_name: str, agent_name: str, call: dict[str, Any]
) -> dict[str, Any]:
    """Validate, run with the policy's timeout and retries, offload a large result."""
    rt = get_runtime()
    agent = _require_agent(agent_name)
    call_id, name = str(call["id"]), str(call["name"])
    await asyncio.to_thread(
        transition, run_id, RunStatus.EXECUTING.value, "executing", {"tool_call_id": call_id}
    )
    with tool_span(name, call_id, run_id=run_id, step_name=step_name) as span:
        tool = agent.tool(name)
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
        cached = _cache_get(name, call.get("input"), policy.cache_ttl_s)
        if cached is not None:
            output: Any = cached
        else:
            outcome = await _with_retries(tool.handler, args, ctx, policy)
            if outcome["error"] is not None:
                span.record_error(outcome["error"]["type"], outcome["error"]["message"])
                return tool_result(call_id, json.dumps(outcome["error"]), is_error=True)
            output = outcome["output"]
            _cache_put(name, call.get("input"), policy.cache_ttl_s, output)
        offloaded = await db_call(
            offload_if_large,
            _as_text(output),
            limit_bytes=rt.settings.payload_offload_bytes,
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


# A read tool's cache lives in the worker process: read tools are side-effect free, so a
# cache miss after a restart only costs one more call.
_CACHE: dict[str, tuple[float, Any]] = {}


def _cache_key(name: str, arguments: Any) -> str:
    return name + ":" + json.dumps(arguments, sort_keys=True, default=str)


def _cache_get(name: str, arguments: Any, ttl: float) -> Any:
    if ttl <= 0:
        return None
    hit = _CACHE.get(_cache_key(name, arguments))
    if hit and hit[0] > time.monotonic():
        return hit[1]
    return None


def _cache_put(name: str, arguments: Any, ttl: float, value: Any) -> None:
    if ttl > 0:
        _CACHE[_cache_key(name, arguments)] = (time.monotonic() + ttl, value)
