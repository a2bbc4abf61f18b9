"""The write path of the loop: approval (when the policy asks), then the effect, then its outcome.

    approve-{i}-{call_id}        approval record + awaiting_approval        (a step)
      wait approval:{id}         durable; no thread held                     (DBOS recv)
    tool-{i}-{call_id}           hash re-check + effect + outbox, one txn    (a step)
      wait {idempotency key}     the relay / reconciler / a person answers   (DBOS recv)
    reconcile-{i}-{call_id}-{n}  reconciling, while the outcome is unknown   (a step)

The action hash is computed inside steps (it includes the policy version, which a deploy may
change), and the tool step refuses to record an effect whose hash differs from the approved
one: what runs is exactly what was approved.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dbos import DBOS
from pydantic import ValidationError

from ledgerloop.agent import dbos_waiters, steps
from ledgerloop.agent.hibernation import wait_message
from ledgerloop.agent.steps import CODE_STEP, tool_result
from ledgerloop.approvals.preview import render_preview
from ledgerloop.approvals.store import approval_expire, approval_request, approval_topic
from ledgerloop.db.connect import Conn
from ledgerloop.effects.hashing import idempotency_key, request_hash
from ledgerloop.effects.ledger import Effect, compensation_begin, effect_begin, effect_require
from ledgerloop.effects.messages import DeliveryRequest, EffectStatus, parse_message
from ledgerloop.faults import hit
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_ensure_status
from ledgerloop.runtime import get_runtime
from ledgerloop.telemetry import tool_span
from ledgerloop.tools.policy import OnReject, OnTimeout
from ledgerloop.tools.registry import Tool

if TYPE_CHECKING:
    from ledgerloop.agent.loop import AgentLoop


def _target(tool: Tool) -> str:
    assert tool.effect is not None
    return f"{tool.effect.method} {tool.effect.destination}{tool.effect.path}"


def _action(tool: Tool, call: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The validated body and its hash; raises ValidationError for bad arguments."""
    assert tool.body is not None
    args = tool.input_model.model_validate(call.get("input") or {})
    body = tool.body(args)
    policy_version = get_runtime().policy.version
    return body, request_hash(tool.name, body, _target(tool), policy_version)


# -- step bodies (at least once; idempotent) ------------------------------------------------
# Plain functions where they can be: DBOS runs a sync step body, its journal check and its
# checkpoint in one trip to its thread pool (an async body costs three).


def request_approval(
    run_id: str, tenant_id: str, deadline: float, tool_name: str, call: dict[str, Any]
) -> dict[str, Any]:
    rt = get_runtime()
    tool = _tool(run_id, tool_name)
    policy = rt.policy.for_tool(tool_name)
    try:
        body, action_hash = _action(tool, call)
    except ValidationError as exc:
        return {"invalid": f"invalid arguments for {tool_name}: {exc}"}
    now = time.time()
    # keep_waiting: the approval stays open as long as the run may live.
    expires = (
        deadline if policy.on_timeout is OnTimeout.KEEP_WAITING else now + policy.approval_ttl_s
    )
    expires = min(expires, deadline)
    preview = render_preview(tool_name, body, {"version": rt.policy.version})

    def record(conn: Conn) -> dict[str, Any]:
        with conn.transaction():
            approval = approval_request(
                conn,
                run_id=uuid.UUID(run_id),
                tenant_id=uuid.UUID(tenant_id),
                tool=tool_name,
                tool_call_id=str(call["id"]),
                action_hash=action_hash,
                preview=preview,
                policy_version=rt.policy.version,
                required_roles=policy.approver_roles,
                expires_at=datetime.fromtimestamp(expires, UTC),
            )
            run_ensure_status(
                conn,
                uuid.UUID(run_id),
                RunStatus.AWAITING_APPROVAL,
                "approval_requested",
                {
                    "approval_id": str(approval.id),
                    "tool": tool_name,
                    "tool_call_id": str(call["id"]),
                    "action_hash": action_hash,
                },
            )
        return {
            "approval_id": str(approval.id),
            "action_hash": action_hash,
            "expires_at": approval.expires_at.timestamp() if approval.expires_at else expires,
        }

    with rt.pool.connection() as conn:
        return record(conn)


def expire_approval(run_id: str, approval_id: str) -> dict[str, Any]:
    with get_runtime().pool.connection() as conn:
        approval = approval_expire(conn, uuid.UUID(approval_id))
    return {"status": str(approval.status)}


async def record_effect(
    run_id: str,
    tenant_id: str,
    step_name: str,
    tool_name: str,
    call: dict[str, Any],
    approved_hash: str | None,
) -> dict[str, Any]:
    rt = get_runtime()
    tool = _tool(run_id, tool_name)
    assert tool.effect is not None
    call_id = str(call["id"])
    key = idempotency_key(run_id, call_id)
    policy = rt.policy.for_tool(tool_name)
    with tool_span(
        tool_name, call_id, run_id=run_id, step_name=step_name, idempotency_key=key
    ) as span:
        try:
            body, action_hash = _action(tool, call)
        except ValidationError as exc:
            span.record_error("InvalidArguments", "arguments failed validation")
            return {
                "result": tool_result(
                    call_id, f"invalid arguments for {tool_name}: {exc}", is_error=True
                )
            }
        if approved_hash is not None and action_hash != approved_hash:
            span.record_error("ApprovalMismatch", "action changed after approval")
            return {
                "result": tool_result(
                    call_id,
                    f"refused: the action's hash {action_hash} differs from the approved "
                    f"{approved_hash}; a changed action needs a new approval",
                    is_error=True,
                )
            }
        delivery = DeliveryRequest(
            path=tool.effect.path,
            method=tool.effect.method,
            body=body,
            idempotency_header=policy.idempotency_header,
            honours_idempotency=tool.effect.honours_idempotency,
            lookup_path=tool.effect.lookup_path,
            timeout_ms=policy.timeout_ms,
            max_attempts=policy.max_retries + 1,
            deadline_s=policy.deadline_s,
        )

        def record(conn: Conn) -> dict[str, Any]:
            # The effect, its outbox row and the run's move to executing commit together.
            with conn.transaction():
                run_ensure_status(
                    conn,
                    uuid.UUID(run_id),
                    RunStatus.EXECUTING,
                    "executing",
                    {"tool_call_id": call_id, "idempotency_key": key},
                )
                effect = effect_begin(
                    conn,
                    key=key,
                    run_id=uuid.UUID(run_id),
                    tenant_id=uuid.UUID(tenant_id),
                    tool=tool_name,
                    request_hash=action_hash,
                    destination=tool.effect.destination,  # type: ignore[union-attr]
                    request=delivery,
                )
            return _recorded(effect)

        # Watch from before the commit: the outcome may be recorded before we look.
        with dbos_waiters.watch(run_id, key) as watch:
            recorded: dict[str, Any] = await steps.db_call(record)
            if recorded["status"] not in _SETTLED and await watch.wait(SETTLE_WATCH_S):
                recorded = await steps.db_call(lambda conn: _recorded(effect_require(conn, key)))
        span.set_effect_status(recorded["status"])
        return recorded


#: How long the act step itself watches for its effect's outcome. Most downstreams answer
#: inside it: the outcome is then this step's result, and the workflow skips a durable wait
#: (its message stays unread; nothing waits on that topic again). Slower effects, unknown
#: outcomes and people are left to the durable wait. Nothing holds a thread meanwhile.
SETTLE_WATCH_S = 0.5
_SETTLED = frozenset({EffectStatus.SUCCEEDED.value, EffectStatus.FAILED.value})


def _recorded(effect: Effect) -> dict[str, Any]:
    recorded: dict[str, Any] = {"key": effect.key, "status": effect.status.value}
    if effect.status.value in _SETTLED:
        # The same fields as the effect's message (app/ledgerloop/effects/messages.py).
        recorded["outcome"] = {
            "status": effect.status.value,
            "result": effect.result,
            "error": effect.error,
            "external_reference": effect.external_reference,
        }
    return recorded


def _tool(run_id: str, name: str) -> Tool:
    from ledgerloop.agent.definition import agents

    for agent in agents().values():
        tool = agent.tool(name)
        if tool is not None:
            return tool
    raise LookupError(f"tool {name!r} is not registered in this worker (run {run_id})")


# -- orchestration (workflow code: deterministic, reads only step results) -------------------


async def act_write(loop: AgentLoop, i: int, call: dict[str, Any], tool: Tool) -> dict[str, Any]:
    from ledgerloop.agent.loop import _step

    call_id = str(call["id"])
    policy = get_runtime().policy.for_tool(tool.name)
    approved_hash: str | None = None
    if policy.requires_approval:
        outcome = await _await_approval(loop, i, call, tool, policy)
        if "result" in outcome or "stop" in outcome:
            return outcome
        approved_hash = outcome["action_hash"]
    name = f"tool-{i}-{call_id}"
    recorded: dict[str, Any] = await _step(
        name,
        CODE_STEP,
        record_effect,
        loop.run_id,
        loop.tenant_id,
        name,
        tool.name,
        call,
        approved_hash,
    )
    if "result" in recorded:
        return recorded
    hit("loop.after_effect_recorded")
    if "outcome" in recorded:
        return _settled(loop, call_id, recorded["key"], tool, recorded["outcome"])
    return await _await_effect(loop, i, call_id, recorded["key"], tool)


def _settled(
    loop: AgentLoop, call_id: str, key: str, tool: Tool, outcome: dict[str, Any]
) -> dict[str, Any]:
    """The tool result of a succeeded or failed effect."""
    if outcome["status"] == EffectStatus.FAILED.value:
        return {"result": tool_result(call_id, outcome["error"] or "failed", is_error=True)}
    if tool.effect is not None and tool.effect.compensate_path:
        loop.compensable.append(
            {
                "call_id": call_id,
                "key": key,
                "tool": tool.name,
                "ref": outcome["external_reference"],
            }
        )
    content = json.dumps(outcome["result"]) if outcome["result"] is not None else "ok"
    return {"result": tool_result(call_id, content)}


async def _await_approval(
    loop: AgentLoop, i: int, call: dict[str, Any], tool: Tool, policy: Any
) -> dict[str, Any]:
    from ledgerloop.agent.loop import _step

    call_id = str(call["id"])
    asked: dict[str, Any] = await _step(
        f"approve-{i}-{call_id}",
        CODE_STEP,
        request_approval,
        loop.run_id,
        loop.tenant_id,
        loop.deadline,
        tool.name,
        call,
    )
    if "invalid" in asked:
        return {"result": tool_result(call_id, asked["invalid"], is_error=True)}
    message = await wait_message(
        approval_topic(uuid.UUID(asked["approval_id"])), asked["expires_at"]
    )
    if message is None:
        await _step(
            f"approve-{i}-{call_id}-expired",
            CODE_STEP,
            expire_approval,
            loop.run_id,
            asked["approval_id"],
        )
        if asked["expires_at"] >= loop.deadline:
            return {
                "stop": (await loop._finish(RunStatus.FAILED, "deadline_exceeded", {}))["status"]
            }
        return {
            "stop": (
                await loop._finish(
                    RunStatus.CANCELLED, "approval_expired", {"approval_id": asked["approval_id"]}
                )
            )["status"]
        }
    decision = dict(message)
    if (
        decision.get("decision") == "approved"
        and decision.get("action_hash") == asked["action_hash"]
    ):
        return {"action_hash": asked["action_hash"]}
    reason = decision.get("reason") or "no reason given"
    who = decision.get("decided_by") or "an approver"
    if policy.on_reject is OnReject.CANCEL:
        return {
            "stop": (
                await loop._finish(
                    RunStatus.CANCELLED,
                    "approval_rejected",
                    {"approval_id": asked["approval_id"], "rejection_reason": reason},
                )
            )["status"]
        }
    await _step(
        f"approve-{i}-{call_id}-rejected",
        CODE_STEP,
        steps.transition,
        loop.run_id,
        RunStatus.PLANNING.value,
        "approval_rejected",
        {"approval_id": asked["approval_id"], "reason": reason},
    )
    text = f"rejected by {who}: {reason}"
    return {"result": tool_result(call_id, text, is_error=True)}


async def _await_effect(
    loop: AgentLoop, i: int, call_id: str, key: str, tool: Tool
) -> dict[str, Any]:
    from ledgerloop.agent.loop import _step

    unknown_rounds = 0
    while True:
        message = await wait_message(key, loop.deadline)
        if message is None:
            return {
                "stop": (
                    await loop._finish(
                        RunStatus.FAILED, "deadline_exceeded", {"waiting_for_effect": key}
                    )
                )["status"]
            }
        outcome = parse_message(message)
        status = EffectStatus(outcome["status"])
        if status.value in _SETTLED:
            return _settled(loop, call_id, key, tool, dict(outcome))
        # outcome_unknown or needs_human: the run waits in reconciling until it is settled.
        unknown_rounds += 1
        await _step(
            f"reconcile-{i}-{call_id}-{unknown_rounds}",
            CODE_STEP,
            steps.transition,
            loop.run_id,
            RunStatus.RECONCILING.value,
            "reconciling",
            {"idempotency_key": key, "effect_status": status.value},
        )


# -- compensation ---------------------------------------------------------------------------


def record_compensation(run_id: str, tool_name: str, key: str, ref: str | None) -> dict[str, Any]:
    """Begin the compensating effect of `key` (its own key, `...:compensate`, and audit trail)."""
    rt = get_runtime()
    tool = _tool(run_id, tool_name)
    assert tool.effect is not None
    assert tool.effect.compensate_path is not None
    policy = rt.policy.for_tool(tool_name)
    delivery = DeliveryRequest(
        path=tool.effect.compensate_path.format(ref=ref or "", key=key),
        method="POST",
        idempotency_header=policy.idempotency_header,
        # Compensating calls are declared idempotent: resending one is always safe.
        honours_idempotency=True,
        timeout_ms=policy.timeout_ms,
        max_attempts=policy.max_retries + 1,
        deadline_s=policy.deadline_s,
    )

    def record(conn: Conn) -> dict[str, Any]:
        with conn.transaction():
            effect = compensation_begin(conn, effect_require(conn, key), delivery)
        return {"key": effect.key, "status": str(effect.status)}

    with rt.pool.connection() as conn:
        return record(conn)


async def compensate_all(loop: AgentLoop) -> list[dict[str, Any]]:
    """Undo this run's compensable effects, newest first, each as a new effect; wait for each.

    A compensation that fails is parked for a person by the ledger; the run does not wait
    for that person longer than the tool's policy deadline, and the parked effect keeps its
    owner (this run) for whoever resolves it.
    """
    from ledgerloop.agent.loop import _step

    outcomes = []
    for item in reversed(loop.compensable):
        recorded: dict[str, Any] = await _step(
            f"compensate-{item['call_id']}",
            CODE_STEP,
            record_compensation,
            loop.run_id,
            item["tool"],
            item["key"],
            item["ref"],
        )
        hit("loop.after_compensation_recorded")
        wait_s = get_runtime().policy.for_tool(item["tool"]).deadline_s
        status = recorded["status"]
        while status not in (EffectStatus.SUCCEEDED.value, EffectStatus.FAILED.value):
            message = await DBOS.recv_async(recorded["key"], wait_s)
            if message is None:
                break
            status = parse_message(message)["status"]
        outcomes.append({"key": recorded["key"], "status": status})
    loop.compensable.clear()
    return outcomes
