"""The approval store: one record per proposed action, bound to its exact hash.

An approval names the run, the tool call and the action hash it covers. A decision is recorded
and sent to the run's workflow (dbos.send_message) in ONE transaction, so the workflow hears of
every recorded decision and of no other. Every event may arrive twice, out of order or late:
the same decision again is a duplicate; a different one, or one on an expired, superseded or
cancelled approval, or on a run that stopped waiting, is refused with the reason.

Lock order everywhere: principal, then run, then approval, the same order a run cancellation
takes (run, then its approvals), so decisions and cancellations never deadlock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg.errors
from psycopg.types.json import Jsonb

from ledgerloop.approvals.errors import (
    ApprovalConflict,
    ApprovalNotFound,
    ApprovalUndeliverable,
    Forbidden,
    InvalidApprovalInput,
)
from ledgerloop.approvals.principals import APPROVER, Principal, principal_lock
from ledgerloop.approvals.records import Approval as Approval
from ledgerloop.approvals.records import ApprovalStatus as ApprovalStatus
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.effects.hashing import canonical_json
from ledgerloop.runs.states import RunStatus
from ledgerloop.runs.store import Outcome, RunNotFound

Q = load_queries("ledgerloop.approvals")


#: The verbs a principal sends -> the status (and message `decision`) they produce.
DECISIONS: dict[str, ApprovalStatus] = {
    "approve": ApprovalStatus.APPROVED,
    "reject": ApprovalStatus.REJECTED,
}


@dataclass(frozen=True)
class Decision:
    """The result of approval_decide: APPLIED (recorded and sent now) or DUPLICATE."""

    outcome: Outcome
    approval: Approval

    @property
    def message(self) -> dict[str, Any]:
        return decision_message(self.approval)


def approval_topic(approval_id: uuid.UUID) -> str:
    """The DBOS topic (and message id) a decision on `approval_id` is sent under."""
    return f"approval:{approval_id}"


def decision_message(approval: Approval) -> dict[str, Any]:
    """The message the workflow receives. Before executing, it compares action_hash with the
    hash of the action it is about to run."""
    return {
        "approval_id": str(approval.id),
        "decision": approval.decision,
        "action_hash": approval.action_hash,
        "reason": approval.reason,
        "decided_by": approval.decided_by_name,
    }


def approval_request(
    conn: Conn,
    *,
    run_id: uuid.UUID,
    tenant_id: uuid.UUID,
    tool: str,
    tool_call_id: str,
    action_hash: str,
    preview: dict[str, Any],
    policy_version: str,
    required_roles: Iterable[str] = (APPROVER,),
    expires_at: datetime | None = None,
    ttl_s: float | None = None,
    now: datetime | None = None,
) -> Approval:
    """Ask for approval of one exact action. Idempotent: a workflow step that re-runs after a
    crash gets the same record back. A new hash for the same tool call supersedes the older
    pending ones, so a stale proposal can no longer be approved.

    The approval expires `ttl_s` after the database's now(), or at `expires_at`, whichever
    comes first: expiry is computed and checked by the same clock."""
    roles = tuple(dict.fromkeys(required_roles)) or (APPROVER,)
    if not tool or not tool_call_id or not action_hash:
        raise InvalidApprovalInput(
            "an approval needs a tool, a tool_call_id and an action_hash",
            fix="pass the values of the tool call being approved",
        )
    with conn.transaction():
        row = conn.execute(
            Q["approval_insert"],
            {
                "id": uuid.uuid4(),
                "run_id": run_id,
                "tenant_id": tenant_id,
                "tool": tool,
                "tool_call_id": tool_call_id,
                "action_hash": action_hash,
                "preview": Jsonb(preview),
                "policy_version": policy_version,
                "required_roles": list(roles),
                "expires_at": expires_at,
                "ttl_s": ttl_s,
                "now": now,
            },
        ).fetchone()
        if row is not None:
            # Only a fresh proposal supersedes: replaying an old request changes nothing.
            conn.execute(
                Q["approval_supersede"],
                {
                    "run_id": run_id,
                    "tool_call_id": tool_call_id,
                    "action_hash": action_hash,
                    "now": now,
                },
            )
            return Approval.from_row(row)
        existing = conn.execute(
            Q["approval_get_by_action"],
            {"run_id": run_id, "tool_call_id": tool_call_id, "action_hash": action_hash},
        ).fetchone()
    if existing is None or existing["tenant_id"] != tenant_id:
        raise RunNotFound(f"no run {run_id} in tenant {tenant_id}", fix="check the run id")
    return Approval.from_row(existing)


def approval_decide(
    conn: Conn,
    *,
    approval_id: uuid.UUID,
    principal: Principal,
    decision: str,
    reason: str | None = None,
    now: datetime | None = None,
) -> Decision:
    """Record `decision` ("approve" or "reject") by `principal` and send it to the run's
    workflow, in one transaction.

    Raises Unauthenticated (revoked since login), ApprovalNotFound (unknown, or another
    tenant's), Forbidden (no required role), ApprovalConflict (decided otherwise, expired,
    superseded, cancelled, or the run no longer waits) or ApprovalUndeliverable (no workflow).
    An approval found past its expiry is marked expired (that change commits) and refused.
    """
    verdict = DECISIONS.get(decision)
    if verdict is None:
        raise InvalidApprovalInput(
            f"decision must be 'approve' or 'reject', not {decision!r}", fix="send one of those"
        )
    late: ApprovalConflict
    with conn.transaction():
        actor = principal_lock(conn, principal.id)
        seen = approval_get(conn, approval_id)
        if seen is None or seen.tenant_id != actor.tenant_id:
            raise ApprovalNotFound(approval_id)
        role = actor.role_for(seen.required_roles)
        if role is None:
            raise Forbidden(seen.required_roles, actor.roles, f"deciding approval {approval_id}")
        run_row = conn.execute(Q["approval_run_lock"], {"run_id": seen.run_id}).fetchone()
        row = conn.execute(Q["approval_lock"], {"id": approval_id, "now": now}).fetchone()
        if row is None or run_row is None:
            raise ApprovalNotFound(approval_id)  # the run was deleted meanwhile
        current = Approval.from_row(row)

        if current.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED):
            if current.status is verdict:
                return Decision(Outcome.DUPLICATE, current)
            when = current.decided_at.isoformat() if current.decided_at else "?"
            raise ApprovalConflict(
                f"approval {approval_id} was already {current.status.value} by "
                f"{current.decided_by_name} at {when}",
                state=current.status.value,
                current=current,
            )
        if current.status is not ApprovalStatus.PENDING:
            raise ApprovalConflict(
                f"approval {approval_id} is {current.status.value}; it can no longer be decided",
                state=current.status.value,
                current=current,
            )
        if row["past_expiry"]:
            # Expiry is a fact worth keeping even though the decision is refused: record it,
            # let this transaction commit, and raise after.
            expired = _expire(conn, approval_id, now) or current
            expires = current.expires_at.isoformat() if current.expires_at else "?"
            late = ApprovalConflict(
                f"approval {approval_id} expired at {expires}; it can no longer be decided",
                state=ApprovalStatus.EXPIRED.value,
                current=expired,
            )
        elif run_row["status"] != RunStatus.AWAITING_APPROVAL:
            raise ApprovalConflict(
                f"run {current.run_id} is {run_row['status']}, not waiting for this approval",
                state=f"run_{run_row['status']}",
                current=current,
            )
        else:
            return Decision(
                Outcome.APPLIED, _record(conn, current, actor, role, verdict, reason, now)
            )
    raise late


def _record(
    conn: Conn,
    current: Approval,
    actor: Principal,
    role: str,
    verdict: ApprovalStatus,
    reason: str | None,
    now: datetime | None,
) -> Approval:
    row = conn.execute(
        Q["approval_record_decision"],
        {
            "id": current.id,
            "decision": verdict.value,
            "principal_id": actor.id,
            "principal_name": actor.name,
            "token_id": actor.token_id,
            "auth_role": role,
            "reason": reason,
            "now": now,
        },
    ).fetchone()
    assert row is not None, "the approval row is locked and pending"
    decided = Approval.from_row(row)
    try:
        conn.execute(
            Q["approval_send_decision"],
            {
                "destination_id": str(decided.run_id),
                "message": canonical_json(decision_message(decided)),
                "topic": approval_topic(decided.id),
                # Fresh, not derived from the approval: this transaction sends at most once
                # (the row was pending), and a message id nobody can predict cannot be taken
                # first by someone else's message, which would make DBOS drop this one.
                "message_id": f"{approval_topic(decided.id)}:{uuid.uuid4()}",
            },
        )
    except psycopg.errors.ForeignKeyViolation as exc:
        # Raised inside the transaction: the decision rolls back with the failed send.
        raise ApprovalUndeliverable(
            f"run {decided.run_id} has no workflow to receive the decision; nothing was recorded",
            fix="start runs with ledgerloop.start_run or the API so that each has a workflow",
        ) from exc
    return decided


def _expire(conn: Conn, approval_id: uuid.UUID, now: datetime | None) -> Approval | None:
    row = conn.execute(Q["approval_expire"], {"id": approval_id, "now": now}).fetchone()
    return Approval.from_row(row) if row else None


def approval_expire(conn: Conn, approval_id: uuid.UUID, now: datetime | None = None) -> Approval:
    """Mark the approval expired if it is pending and `now` is past expires_at.

    Returns the approval as it stands afterwards: a workflow whose wait timed out checks the
    status, because a decision that committed just before is still `approved`/`rejected`
    (and its message is waiting to be received).
    """
    with conn.transaction():
        expired = _expire(conn, approval_id, now)
        current = expired or approval_get(conn, approval_id)
    if current is None:
        raise ApprovalNotFound(approval_id)
    return current


@dataclass(frozen=True)
class ApprovalReading:
    """An approval as it stands, and the seconds until it expires by the database's clock."""

    approval: Approval
    remaining_s: float | None  # None: it never expires


def approval_check(
    conn: Conn, approval_id: uuid.UUID, now: datetime | None = None
) -> ApprovalReading:
    """What a waiting run acts on: expire the approval if it is due, then read it as it stands.

    A message to the run is only a signal to call this; the row is the decision. One
    transaction, two statements: the second reads after the first's lock wait, so a decision
    that committed meanwhile is seen, never a stale `pending`.
    """
    with conn.transaction():
        _expire(conn, approval_id, now)
        row = conn.execute(Q["approval_read"], {"id": approval_id, "now": now}).fetchone()
    if row is None:
        raise ApprovalNotFound(approval_id)
    remaining = row["remaining_s"]
    return ApprovalReading(Approval.from_row(row), None if remaining is None else float(remaining))


def approval_cancel_for_run(
    conn: Conn, run_id: uuid.UUID, *, now: datetime | None = None
) -> list[uuid.UUID]:
    """Cancel the run's pending approvals; returns their ids.

    Call it in the transaction that moves the run to cancelled, after the run update, so a
    decision racing the cancellation either commits first or sees the cancelled run.
    """
    rows = conn.execute(Q["approval_cancel_for_run"], {"run_id": run_id, "now": now}).fetchall()
    return [row["id"] for row in rows]


def approval_get(conn: Conn, approval_id: uuid.UUID) -> Approval | None:
    row = conn.execute(Q["approval_get"], {"id": approval_id}).fetchone()
    return Approval.from_row(row) if row else None


def approval_list(
    conn: Conn,
    *,
    status: ApprovalStatus | str | None = None,
    run_id: uuid.UUID | None = None,
    limit: int = 50,
) -> list[Approval]:
    """Newest first. Inside tenant_scope only that tenant's approvals are visible."""
    try:
        wanted = ApprovalStatus(status).value if status is not None else None
    except ValueError:
        raise InvalidApprovalInput(
            f"unknown approval status {status!r}",
            fix=f"use one of {', '.join(s.value for s in ApprovalStatus)}",
        ) from None
    rows = conn.execute(
        Q["approval_list"],
        {
            "status": wanted,
            "run_id": run_id,
            "limit": limit,
        },
    ).fetchall()
    return [Approval.from_row(row) for row in rows]
