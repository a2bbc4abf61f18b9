"""The step bodies of an approval: its request, and the check of its row after each wake.

Messages wake; records decide. A DBOS message is only a signal (any role holding DBOS's grants
can send one): after every wake the run reads the approval row (`check_approval`) and acts on
what it read. The action hash is computed in the step (it includes the policy version, which a
deploy may change); the write step records no effect unless the approval row is approved by a
principal for exactly that hash (`write_steps`).
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from ledgerloop.agent.effect_record import not_granted
from ledgerloop.agent.write_steps import write_action, write_tool
from ledgerloop.approvals.preview import render_preview
from ledgerloop.approvals.records import ApprovalStatus
from ledgerloop.approvals.store import approval_check, approval_request
from ledgerloop.db.connect import Conn
from ledgerloop.faults import hit
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import run_ensure_status
from ledgerloop.runtime import get_runtime
from ledgerloop.tools.policy import OnTimeout
from ledgerloop.tools.registry import Tool

log = logging.getLogger(__name__)


def _tool_summary(tool: Tool, args: BaseModel) -> str | None:
    """The tool's own one-line preview, if it has one; a failing one must not block the
    approval (the approver still sees every argument)."""
    if tool.preview is None:
        return None
    try:
        return str(tool.preview(args))
    except Exception:
        log.warning("the preview of tool %s failed; using the default summary", tool.name)
        return None


# Step bodies (at least once; idempotent).


def request_approval(
    run_id: str,
    tenant_id: str,
    deadline: float,
    agent_name: str,
    tool_name: str,
    call: dict[str, Any],
    mcp_definition: dict[str, Any] | None = None,
) -> dict[str, Any]:
    rt = get_runtime()
    tool = write_tool(agent_name, tool_name, mcp_definition)
    policy = rt.policy.for_write_tool(tool_name)
    try:
        body, action_hash, args = write_action(tool, call)
    except ValidationError as exc:
        return {"invalid": f"invalid arguments for {tool_name}: {exc}"}
    arguments = args.model_dump(mode="json")
    # Decided here, in the step, so the journal holds the decision: a replay takes the same
    # path whatever the policy file says by then.
    needed, why = policy.approval_needed(arguments)
    if not needed:
        return {
            "required": False,
            "why": why,
            "action_hash": action_hash,
            "policy_version": rt.policy.version,
        }
    # Expiry is computed by the database's clock (ttl from its now()), the one that checks
    # it; the run's deadline caps it. keep_waiting: open as long as the run may live.
    ttl_s = None if policy.on_timeout is OnTimeout.KEEP_WAITING else policy.approval_ttl_s
    preview = render_preview(
        tool_name,
        body,
        {"version": rt.policy.version, "summary": policy.summary},
        fields=arguments,
        tool_summary=_tool_summary(tool, args),
    )

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
                expires_at=datetime.fromtimestamp(deadline, UTC),
                ttl_s=ttl_s,
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
            # When the wait for a person began (its span starts here, in whichever execution
            # the wait ends).
            "requested_at": approval.requested_at.timestamp(),
        }

    with rt.pool.connection() as conn:
        asked = record(conn)
    # The approval is visible to approvers; the step's checkpoint is not written yet.
    hit("approval.after_request")
    checked = check_approval(run_id, asked["approval_id"], action_hash, str(call["id"]), tenant_id)
    return {**asked, **checked}


def check_approval(
    run_id: str,
    approval_id: str,
    action_hash: str,
    tool_call_id: str,
    tenant_id: str,
) -> dict[str, Any]:
    """The approval row as the run acts on it: a verdict, never a message's word.

    `approved` only when a principal decided it (the table's constraint says who, with which
    role) for exactly `action_hash`, asked for this run's call `tool_call_id` (of
    `tenant_id`); a pending approval past its expiry (the database's clock) is expired here.
    `wait_s` says how long a pending one may still be waited for.
    """
    with get_runtime().pool.connection() as conn:
        reading = approval_check(conn, uuid.UUID(approval_id))
    approval = reading.approval
    verdict: dict[str, Any] = {
        "status": approval.status.value,
        "expires_at": approval.expires_at.timestamp() if approval.expires_at else None,
        "now": time.time(),
    }
    if approval.status is ApprovalStatus.PENDING:
        # None: no expiry; the run's deadline bounds the wait.
        remaining = reading.remaining_s
        verdict["wait_s"] = None if remaining is None else max(remaining, 0.0)
    elif approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED):
        verdict["decided_by"] = approval.decided_by_name or str(approval.decided_by_principal)
        verdict["decided_at"] = approval.decided_at.timestamp() if approval.decided_at else None
        verdict["reason"] = approval.reason
        problem = not_granted(
            approval,
            action_hash,
            run_id=run_id,
            tool_call_id=tool_call_id,
            tenant_id=tenant_id,
        )
        if approval.status is ApprovalStatus.APPROVED and problem is not None:
            verdict["status"] = "mismatch"
            verdict["problem"] = problem
    if str(approval.run_id) != run_id:
        verdict = {"status": "mismatch", "problem": f"approval {approval_id} is not this run's"}
    return verdict
