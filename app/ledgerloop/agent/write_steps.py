"""The step bodies of the write path: the effect's record, its send and its outcome (the
approval's are in `approval_steps`, compensations' in `compensation_steps`).

The orchestration around them (which step runs when, the durable waits) is in
`ledgerloop.agent.primitives`; these bodies only touch the database, each at least once and
idempotently.

Messages wake; records decide. A DBOS message is only a signal (any role holding DBOS's grants
can send one): after every wake the run reads the effect row (`read_outcome`) and acts on what
it read.

The action hash is computed inside steps (it includes the policy version, which a deploy may
change), and the tool step records no effect unless, in its own transaction, the approval row
is approved by a principal for exactly that hash, and was asked for this call of this run:
what runs is exactly what was approved, once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Any

from dbos import DBOS
from pydantic import BaseModel, ValidationError

from ledgerloop.agent import dbos_waiters
from ledgerloop.agent.act_mcp import as_tool, mcp_call_facts
from ledgerloop.agent.definition import get_agent
from ledgerloop.agent.effect_record import (
    NotGranted,
    Sent,
    not_granted,
    record_claimed_write,
    take_prerecorded,
)
from ledgerloop.agent.stepping import db_call
from ledgerloop.agent.steps import tool_result
from ledgerloop.approvals.store import approval_get
from ledgerloop.db import dbos_checkpoint
from ledgerloop.db.connect import Conn
from ledgerloop.effects.hashing import idempotency_key, request_hash
from ledgerloop.effects.ledger import (
    Effect,
    effect_await,
    effect_begin,
    effect_require,
)
from ledgerloop.effects.messages import DeliveryRequest, EffectStatus
from ledgerloop.effects.outbox import Claimed, Deliverer, Outcome
from ledgerloop.mcptools.client import META_IDEMPOTENCY_KEY
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_ensure_status
from ledgerloop.runtime import Runtime, get_runtime
from ledgerloop.telemetry import ToolRecorder, tool_span
from ledgerloop.telemetry import semconv as sc
from ledgerloop.telemetry.runtrace import span_traceparent
from ledgerloop.tools.policy import EffectFacts, ToolPolicy
from ledgerloop.tools.registry import HttpEffect, McpEffect, Tool

log = logging.getLogger(__name__)


def _target(tool: Tool) -> str:
    effect = tool.effect
    assert effect is not None
    if isinstance(effect, McpEffect):
        return f"mcp {effect.destination} tools/call {effect.tool}"
    return f"{effect.method} {effect.destination}{effect.path}"


def delivery_request(
    tool: Tool, body: Any, policy: ToolPolicy, traceparent: str | None
) -> DeliveryRequest:
    effect = tool.effect
    limits = {
        "timeout_ms": policy.timeout_ms,
        "max_attempts": policy.max_retries + 1,
        "deadline_s": policy.deadline_s,
        "traceparent": traceparent,
    }
    if isinstance(effect, McpEffect):
        return DeliveryRequest(
            body=body,
            mcp_tool=effect.tool,
            mcp_lookup_tool=effect.lookup_tool,
            idempotency_header=META_IDEMPOTENCY_KEY,
            honours_idempotency=effect.honours_idempotency,
            **limits,  # type: ignore[arg-type]
        )
    assert effect is not None
    facts = effect_facts(tool)
    return DeliveryRequest(
        path=effect.path,
        method=effect.method,
        body=body,
        idempotency_header=facts.idempotency_header,
        honours_idempotency=facts.honours_idempotency,
        lookup_path=facts.lookup_path,
        **limits,  # type: ignore[arg-type]
    )


def effect_facts(tool: Tool) -> EffectFacts:
    """How an HTTP write tool's effects are delivered, settled and undone: the policy's
    destination entry first, then what the tool's code declares (docs/policy.md)."""
    effect = tool.effect
    assert isinstance(effect, HttpEffect)
    policy = get_runtime().policy
    return policy.effect_facts(
        effect.destination,
        policy.for_write_tool(tool.name),
        honours_idempotency=effect.honours_idempotency,
        lookup_path=effect.lookup_path,
        compensate_path=effect.compensate_path,
    )


def _compensate_path(tool: Tool) -> str | None:
    return effect_facts(tool).compensate_path if isinstance(tool.effect, HttpEffect) else None


def write_action(tool: Tool, call: dict[str, Any]) -> tuple[dict[str, Any], str, BaseModel]:
    """The validated body, its hash and the validated arguments; raises ValidationError for
    bad arguments."""
    assert tool.body is not None
    args = tool.input_model.model_validate(call.get("input") or {})
    body = tool.body(args)
    policy_version = get_runtime().policy.version
    return body, request_hash(tool.name, body, _target(tool), policy_version), args


# -- step bodies (at least once; idempotent) ------------------------------------------------
# Plain functions where they can be: DBOS runs a sync step body, its journal check and its
# checkpoint in one trip to its thread pool (an async body costs three).


async def record_effect(
    run_id: str,
    tenant_id: str,
    step_name: str,
    agent_name: str,
    tool_name: str,
    call: dict[str, Any],
    approval_id: str | None = None,
    mcp_definition: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The write step's body: the effect recorded, sent when this worker delivers, and what
    its row says once the outcome is recorded (or after a short watch)."""
    recorded, _ = await _record_effect(
        run_id, tenant_id, step_name, agent_name, tool_name, call, approval_id, mcp_definition
    )
    return recorded


async def record_and_send(
    run_id: str,
    tenant_id: str,
    step_name: str,
    agent_name: str,
    tool_name: str,
    call: Any,
    replan_step: str | None = None,
) -> tuple[dict[str, Any], asyncio.Future[bool] | None]:
    """`record_effect` for a step that has more to do (agent.turn_tools): a settled outcome
    from this worker's own delivery comes back as soon as the downstream answered, with the
    future of its record (the relay's `send_now`). Await it before anything durable is made
    of the outcome; False: someone else settled the effect first (`read_effect` says how).
    No future: the result is what the row says, as for `record_effect`.

    `replan_step`: the record of a settled outcome moves the run back to planning under
    that step's name (`Claimed.replan_step`); True from the future says it did."""
    return await _record_effect(
        run_id,
        tenant_id,
        step_name,
        agent_name,
        tool_name,
        call,
        defer=True,
        replan_step=replan_step,
    )


async def read_effect(key: str) -> dict[str, Any]:
    """An effect's row as `record_effect` reports it, marked awaited (effect_await): the
    caller may go on to wait for its outcome."""
    found: dict[str, Any] = await db_call(lambda conn: _recorded(effect_await(conn, key)))
    return found


async def _record_effect(
    run_id: str,
    tenant_id: str,
    step_name: str,
    agent_name: str,
    tool_name: str,
    call: dict[str, Any],
    approval_id: str | None = None,
    mcp_definition: dict[str, Any] | None = None,
    *,
    defer: bool = False,
    replan_step: str | None = None,
) -> tuple[dict[str, Any], asyncio.Future[bool] | None]:
    rt = get_runtime()
    tool = write_tool(agent_name, tool_name, mcp_definition)
    assert tool.effect is not None
    call_id = str(call["id"])
    key = idempotency_key(run_id, call_id)
    # Recorded already, with the checkpoint of the think step that asked for it (write_ahead):
    # its delivery names this span, which takes the ids it was given then.
    ahead = take_prerecorded(key)
    # This worker's relay, when it runs one on this loop: it sends the effect now.
    deliverer = local_deliverer()
    with tool_span(
        tool_name,
        call_id,
        run_id=run_id,
        step_name=step_name,
        idempotency_key=key,
        description=tool.description,
        mcp=mcp_call_facts(tool),
        planned=ahead.span if ahead is not None else None,
    ) as span:
        if approval_id:
            span.set_approval_id(approval_id)
        if (
            ahead is not None
            and deliverer is not None
            and approval_id is None
            and ahead.policy_version == rt.policy.version
        ):
            # The record ahead validated these arguments and hashed this request under this
            # policy, from the same journaled call: its send is under way. Its outcome's
            # record moves the run back as that commit foresaw; a step that expects otherwise
            # waits for the record and moves it itself.
            recorded, confirm = await _take_delivery(
                ahead.sending.result(),
                _with_compensable(ahead.effect, tool),
                defer=defer,
                carries=ahead.replan_step == replan_step,
            )
            if recorded["status"] not in SETTLED:
                with dbos_waiters.watch(run_id, key) as watch:
                    recorded = await _settled_meanwhile(key, recorded, watch, born_awaited=False)
        else:
            answer = await _record_here(
                rt,
                tool,
                span,
                run_id,
                tenant_id,
                step_name,
                call,
                approval_id,
                deliverer,
                defer=defer,
                replan_step=replan_step,
            )
            if isinstance(answer, dict):
                return answer, None
            recorded, confirm = answer
        span.set_effect_status(recorded["status"])
        if recorded["status"] == EffectStatus.FAILED.value:
            outcome = recorded.get("outcome") or {}
            span.record_error(sc.ERROR_EFFECT_FAILED, str(outcome.get("error") or "failed"))
        recorded["recorded_at"] = time.time()  # a durable wait for the outcome starts here
        return recorded, confirm


async def _record_here(
    rt: Runtime,
    tool: Tool,
    span: ToolRecorder,
    run_id: str,
    tenant_id: str,
    step_name: str,
    call: dict[str, Any],
    approval_id: str | None,
    deliverer: Deliverer | None,
    *,
    defer: bool,
    replan_step: str | None,
) -> dict[str, Any] | tuple[dict[str, Any], asyncio.Future[bool] | None]:
    """The write recorded by this step: validated, checked against the policy and its
    approval, committed with its outbox row and the run's move to executing, then sent when
    this worker delivers. A dict: the tool result of a write refused before anything was
    recorded."""
    assert tool.effect is not None
    tool_name = tool.name
    call_id = str(call["id"])
    key = idempotency_key(run_id, call_id)
    policy = rt.policy.for_write_tool(tool_name)
    try:
        body, action_hash, args = write_action(tool, call)
    except ValidationError as exc:
        span.record_error("InvalidArguments", "arguments failed validation")
        return {
            "result": tool_result(
                call_id, f"invalid arguments for {tool_name}: {exc}", is_error=True
            )
        }
    if approval_id is None and policy.approval_needed(args.model_dump(mode="json"))[0]:
        # No approval was asked for (a caller that skipped wait_for_approval, or a policy
        # that changed since the approval step decided): the rules now ask for one.
        span.record_error("ApprovalMissing", "the policy asks for an approval")
        return {
            "result": tool_result(
                call_id,
                f"refused: the policy asks for an approval of this {tool_name} call and "
                "none was given; call it again to ask for one",
                is_error=True,
            )
        }
    # The relay's delivery span links to this one, under the run's root.
    delivery = delivery_request(tool, body, policy, span_traceparent(span.span))
    facts: dict[str, Any] = {
        "key": key,
        "run_id": uuid.UUID(run_id),
        "tenant_id": uuid.UUID(tenant_id),
        "tool": tool_name,
        "request_hash": action_hash,
        "destination": tool.effect.destination,
        "request": delivery,
    }
    moved = {"tool_call_id": call_id, "idempotency_key": key}

    def record_pending(conn: Conn) -> dict[str, Any]:
        # The effect, its outbox row and the run's move to executing commit together,
        # and only after this transaction has read the approval that allows them.
        with conn.transaction():
            if approval_id is not None:
                problem = not_granted(
                    approval_get(conn, uuid.UUID(approval_id)),
                    action_hash,
                    run_id=run_id,
                    tool_call_id=call_id,
                    tenant_id=tenant_id,
                )
                if problem is not None:
                    return {"refused": problem}
            run_ensure_status(
                conn, uuid.UUID(run_id), RunStatus.EXECUTING, "executing", moved, step=step_name
            )
            return _with_compensable(effect_begin(conn, **facts), tool)

    # Watch from before the commit: the outcome may be recorded before we look.
    with dbos_waiters.watch(run_id, key) as watch:
        confirm: asyncio.Future[bool] | None = None
        # Recorded for this worker's relay, the effect is born not awaited (its outcome comes
        # back from the delivery): it is marked before this step waits for a message.
        born_awaited = False
        if deliverer is not None:
            # One statement, one round trip (agent.effect_record).
            try:
                effect, claim = await record_claimed_write(
                    deliverer,
                    rt.pool,
                    step=step_name,
                    payload=moved,
                    tool_call_id=call_id,
                    approval_id=uuid.UUID(approval_id) if approval_id else None,
                    **facts,
                )
            except NotGranted as refused:
                recorded: dict[str, Any] = {"refused": refused.problem}
            else:
                recorded = _with_compensable(effect, tool)
                if claim is not None:
                    claimed = Claimed.at_insert(effect, claim, delivery.to_json(), replan_step)
                    recorded, confirm = await _take_delivery(
                        deliverer.send_now(claimed), recorded, defer=defer, carries=True
                    )
        else:
            # A relay elsewhere delivers: the rows are born pending, for its claim.
            recorded = await db_call(record_pending)
            born_awaited = True
        if "refused" not in recorded:
            # Committed by this step itself: the heartbeat's rewind check asks for it after a
            # failover (fleet.heartbeat).
            dbos_checkpoint.wrote_effect(DBOS.workflow_id or run_id, key)
        if "refused" in recorded:
            span.record_error("ApprovalMismatch", "the approval does not cover this action")
            return {
                "result": tool_result(
                    call_id,
                    f"refused: {recorded['refused']}; a changed action needs a new approval",
                    is_error=True,
                )
            }
        return await _settled_meanwhile(key, recorded, watch, born_awaited=born_awaited), confirm


async def _take_delivery(
    sending: Awaitable[Sent], recorded: dict[str, Any], *, defer: bool, carries: bool
) -> tuple[dict[str, Any], asyncio.Future[bool] | None]:
    """What this worker's own delivery of a claimed write says. With `defer`, a settled
    outcome whose record carries what the caller expects comes back before its record, with
    the future of that record (`record_and_send`); else the outcome counts once recorded."""
    sent = await sending
    if sent is None:
        return recorded, None
    answered, its_record = sent
    if defer and carries and answered.status.value in SETTLED:
        return {**recorded, **_delivered(answered)}, its_record
    if await its_record:
        return {**recorded, **_delivered(answered)}, None
    return recorded, None


async def _settled_meanwhile(
    key: str, recorded: dict[str, Any], watch: dbos_waiters.Watch, *, born_awaited: bool
) -> dict[str, Any]:
    """An effect not settled yet, watched for a moment (`SETTLE_WATCH_S`): what its row says
    once a message says its outcome was recorded. Whatever it returns unsettled is marked
    awaited (effect_await), for the durable wait that follows.

    `born_awaited`: this step recorded the effect for a relay elsewhere, so its outcome sends a
    message; the row is read when one came, or when none did (a repeat of the step may have
    found an effect recorded for a relay here, which is marked then). Otherwise the effect is
    marked and read first: its outcome may be recorded already, without a message."""
    if recorded["status"] in SETTLED:
        return recorded
    if not born_awaited:
        recorded = await _awaited(key, recorded)
        if recorded["status"] in SETTLED:
            return recorded
    if await watch.wait(SETTLE_WATCH_S) or born_awaited:
        recorded = await _awaited(key, recorded)
    return recorded


async def _awaited(key: str, recorded: dict[str, Any]) -> dict[str, Any]:
    """The effect's row, marked awaited (effect_await), as `recorded` reports it."""
    row = await db_call(lambda conn: _recorded(effect_await(conn, key)))
    return {**row, "compensable": recorded["compensable"]}


def _with_compensable(effect: Effect, tool: Tool) -> dict[str, Any]:
    return {**_recorded(effect), "compensable": _compensate_path(tool) is not None}


#: error.type of an effect wait span by the outcome that ended it.
WAIT_ERRORS = {
    EffectStatus.FAILED.value: sc.ERROR_EFFECT_FAILED,
    EffectStatus.NEEDS_HUMAN.value: sc.ERROR_EFFECT_NEEDS_HUMAN,
    EffectStatus.OUTCOME_UNKNOWN.value: sc.ERROR_EFFECT_OUTCOME_UNKNOWN,
}

#: How long the act step itself watches for its effect's outcome. Most downstreams answer
#: inside it: the outcome is then this step's result, and the workflow skips a durable wait
#: (a message, when the effect was awaited, stays unread: nothing waits on that topic again;
#: a write this worker delivers sends none, migration 0021). Slower effects, unknown
#: outcomes and people are left to the durable wait. Nothing holds a thread meanwhile.
SETTLE_WATCH_S = 0.5
SETTLED = frozenset({EffectStatus.SUCCEEDED.value, EffectStatus.FAILED.value})


def settled_result(call_id: str, outcome: dict[str, Any]) -> dict[str, Any]:
    """The model's tool result for a succeeded or failed effect (its `_reading` outcome)."""
    if outcome["status"] == EffectStatus.FAILED.value:
        return tool_result(call_id, outcome["error"] or "failed", is_error=True)
    content = json.dumps(outcome["result"]) if outcome["result"] is not None else "ok"
    return tool_result(call_id, content)


def local_deliverer() -> Deliverer | None:
    deliverer = get_runtime().deliverer
    return deliverer if deliverer is not None and deliverer.delivers_here() else None


def _delivered(outcome: Outcome) -> dict[str, Any]:
    """What `_recorded` would read back from the effect's row once `outcome` is recorded."""
    return _reading(outcome.status, outcome.result, outcome.error, outcome.external_reference)


def _recorded(effect: Effect) -> dict[str, Any]:
    return {
        "key": effect.key,
        **_reading(effect.status, effect.result, effect.error, effect.external_reference),
    }


def _reading(
    status: EffectStatus, result: Any, error: str | None, ref: str | None
) -> dict[str, Any]:
    recorded: dict[str, Any] = {"status": status.value}
    if status.value in SETTLED:
        # The same fields as the effect's message (app/ledgerloop/effects/messages.py).
        recorded["outcome"] = {
            "status": status.value,
            "result": result,
            "error": error,
            "external_reference": ref,
        }
    return recorded


def read_outcome(
    run_id: str,
    step_name: str,
    key: str,
    reconcile: bool,
    previous: list[Any] | None = None,
    round_: int = 1,
) -> dict[str, Any]:
    """The effect row as the run acts on it (a message said only that it may have changed).

    With `reconcile`, an unknown outcome moves the run to reconciling, and a reconciling round
    is recorded (once, by this step) whenever the effect's status or attempts differ from the
    `previous` reading: a wake that changed nothing (someone else's message) records nothing.
    """
    recorded = 0
    with get_runtime().pool.connection() as conn:
        effect = effect_require(conn, key)
        unknown = effect.status in (EffectStatus.OUTCOME_UNKNOWN, EffectStatus.NEEDS_HUMAN)
        if reconcile and unknown and previous != [effect.status.value, effect.attempts]:
            with conn.transaction():
                run_ensure_status(
                    conn,
                    uuid.UUID(run_id),
                    RunStatus.RECONCILING,
                    "reconciling",
                    {"idempotency_key": key, "effect_status": effect.status.value, "round": round_},
                    step=step_name,
                )
            recorded = 1
    return {
        **_recorded(effect),
        "attempts": effect.attempts,
        "round_recorded": recorded,
        "now": time.time(),
    }


def _find_tool(agent_name: str, name: str) -> Tool | None:
    """The agent's own tool (two agents may each have a tool of one name)."""
    agent = get_agent(agent_name)
    return agent.tool(name) if agent is not None else None


def write_tool(agent_name: str, name: str, mcp_definition: dict[str, Any] | None = None) -> Tool:
    """The tool a write step runs: an MCP write tool from the definition the run journaled
    in its discovery (passed in by the workflow: agents in one worker may each discover a
    tool of one name on a different server), else the agent's own."""
    if mcp_definition is not None:
        return as_tool(mcp_definition)
    tool = _find_tool(agent_name, name)
    if tool is None:
        raise LookupError(f"agent {agent_name!r} has no tool {name!r} in this worker")
    return tool
