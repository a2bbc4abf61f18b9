"""Step `approve-{i}-{call_id}` and the durable wait for a person's decision
(`wait_for_approval`, one of the durable primitives: ledgerloop.agent.primitives)."""

from __future__ import annotations

import uuid
from typing import Any

from ledgerloop.agent import act_mcp, approval_steps, steps, tracing
from ledgerloop.agent.act_sandbox import suspend_sandboxes
from ledgerloop.agent.context import Approved, RunContext, Stop
from ledgerloop.agent.hibernation import wait_message
from ledgerloop.agent.stepping import CODE_STEP, run_step
from ledgerloop.agent.steps import tool_result
from ledgerloop.approvals.store import approval_topic
from ledgerloop.runs.states import RunStatus
from ledgerloop.runtime import get_runtime
from ledgerloop.tools.policy import OnReject
from ledgerloop.tools.registry import Tool


async def wait_for_approval(
    run: RunContext, i: int, call: dict[str, Any], tool: Tool
) -> Approved | Stop | dict[str, Any]:
    """Step `approve-{i}-{call_id}`, then a durable wait for a person's decision.

    Messages wake; records decide: whatever ends a wait (the decision's message, anyone
    else's, the expiry), step `approve-{i}-{call_id}-{n}` reads the approval row (expiring it
    when due, by the database's clock) and the run acts on what the row says.

    Approved: the exact action's hash, for write_effect (with no approval id when the
    policy's `requires_approval: {when: ...}` does not hold for this call). A tool result
    (the arguments are invalid, or the policy says on_reject: continue): hand it to the
    model. A Stop: the
    approval expired, or the policy says on_reject: cancel.
    """
    call_id = str(call["id"])
    policy = get_runtime().policy.for_write_tool(tool.name)
    if run.sandboxes:
        # A run that waits for a person holds no sandbox: its /work becomes a payload, before
        # the approval exists (so nobody sees a pending approval with a sandbox still up).
        await suspend_sandboxes(run, f"{i}-{call_id}")
    step = f"{run.scope}approve-{i}-{call_id}"
    seen: dict[str, Any] = await run_step(
        step,
        CODE_STEP,
        approval_steps.request_approval,
        run.run_id,
        run.tenant_id,
        run.deadline,
        run.agent.name,
        tool.name,
        call,
        act_mcp.definition_for(run.mcp_tools, tool),
    )
    if "invalid" in seen:
        return tool_result(call_id, seen["invalid"], is_error=True)
    if seen.get("required") is False:
        # The policy's condition does not hold for these arguments (decided, and journaled,
        # by the step): the action runs without a person, under its own hash.
        return Approved(seen["action_hash"], None)
    run.status = RunStatus.AWAITING_APPROVAL.value
    approval_id, action_hash = seen["approval_id"], seen["action_hash"]
    since: float | None = seen.get("requested_at")
    if seen["status"] != "pending":
        # Decided before this execution reached the wait: the request was recorded, then the
        # worker died before its step's checkpoint, and the decision came meanwhile. The run
        # waited all the same, from the request to the decision.
        tracing.waited(
            "approval",
            tool.name,
            since,
            was_replayed=tracing.step_replayed(),
            ended_at=seen.get("decided_at"),
            approval_id=approval_id,
            decision=seen["status"],
        )
    wakes = 0
    while seen["status"] == "pending":
        await wait_message(
            approval_topic(uuid.UUID(approval_id)), _until(seen, seen["wait_s"], run.deadline)
        )
        was_replayed = tracing.wait_replayed()
        wakes += 1
        seen = await run_step(
            f"{step}-{wakes}",
            CODE_STEP,
            approval_steps.check_approval,
            run.run_id,
            approval_id,
            action_hash,
            call_id,
            run.tenant_id,
        )
        tracing.waited(
            "approval",
            tool.name,
            since,
            was_replayed=was_replayed,
            approval_id=approval_id,
            decision=seen["status"],
        )
        since = None  # a later wait starts when this one ended
        if seen["status"] == "pending" and seen["now"] >= run.deadline:
            return Stop(RunStatus.FAILED, "deadline_exceeded")
    status = seen["status"]
    if status == "approved":
        return Approved(action_hash, approval_id)
    if status == "expired":
        # Capped by the run's deadline (to the microsecond the database keeps): the run's
        # time ran out, not the approver's.
        if (seen["expires_at"] or 0) >= run.deadline - 0.001:
            return Stop(RunStatus.FAILED, "deadline_exceeded")
        return Stop(RunStatus.CANCELLED, "approval_expired", {"approval_id": approval_id})
    if status != "rejected":
        # cancelled (the run is being cancelled), superseded, or a record that does not bear
        # out an approval of this action: nothing runs.
        details = {"approval_id": approval_id, "approval_status": status}
        if "problem" in seen:
            details["problem"] = seen["problem"]
        target = RunStatus.CANCELLED if status == "cancelled" else RunStatus.FAILED
        return Stop(target, f"approval_{status}", details)
    reason = seen.get("reason") or "no reason given"
    who = seen.get("decided_by") or "an approver"
    if policy.on_reject is OnReject.CANCEL:
        return Stop(
            RunStatus.CANCELLED,
            "approval_rejected",
            {"approval_id": approval_id, "rejection_reason": reason},
        )
    await run_step(
        f"{step}-rejected",
        CODE_STEP,
        steps.transition,
        run.run_id,
        RunStatus.PLANNING.value,
        "approval_rejected",
        {"approval_id": approval_id, "reason": reason, "decided_by": who},
        f"{step}-rejected",
    )
    run.status = RunStatus.PLANNING.value
    return tool_result(call_id, f"rejected by {who}: {reason}", is_error=True)


def _until(seen: dict[str, Any], wait_s: float | None, cap: float) -> float:
    """The epoch a wait ends at: `wait_s` after the step that measured it, at most `cap`.
    Taken from step results only, so a replay waits on the same terms."""
    return cap if wait_s is None else min(seen["now"] + wait_s, cap)
