"""/v1/approvals: list, and decide. Only an authenticated principal's request decides; nothing
a model writes can, since no field of a run or a tool call reaches this route."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ledgerloop.approvals.store import Approval, ApprovalStatus, approval_decide, approval_list
from ledgerloop.db.connect import tenant_scope
from ledgerloop.http.auth import Caller, Connection
from ledgerloop.http.errors import responses, storable_text

router = APIRouter(prefix="/v1/approvals", tags=["approvals"])


class DecisionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    reason: str | None = Field(default=None, max_length=2000)

    @field_validator("reason")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return storable_text(value) if value is not None else None


class ApprovalOut(BaseModel):
    id: uuid.UUID
    run_id: uuid.UUID
    tool: str
    tool_call_id: str
    action_hash: str = Field(description="sha256 of the exact action; approving approves it")
    preview: dict[str, Any] = Field(description="tool, summary, lines, hidden (secret args)")
    policy_version: str
    required_roles: list[str]
    requested_at: datetime
    expires_at: datetime | None
    status: ApprovalStatus
    decided_by_principal: uuid.UUID | None
    decided_by_name: str | None
    auth_role: str | None
    decision: str | None
    reason: str | None
    decided_at: datetime | None
    closed_at: datetime | None

    @classmethod
    def of(cls, approval: Approval) -> ApprovalOut:
        return cls.model_validate(approval, from_attributes=True)


class ApprovalList(BaseModel):
    approvals: list[ApprovalOut]


class DecisionOut(BaseModel):
    outcome: Literal["applied", "duplicate"] = Field(
        description="duplicate: the same decision was already recorded; nothing changed"
    )
    approval: ApprovalOut


@router.get(
    "", response_model=ApprovalList, responses=responses(401, 422), summary="List approvals"
)
def list_approvals(
    principal: Caller,
    conn: Connection,
    status: ApprovalStatus | None = None,
    run_id: uuid.UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> ApprovalList:
    with tenant_scope(conn, principal.tenant_id):
        found = approval_list(conn, status=status, run_id=run_id, limit=limit)
    return ApprovalList(approvals=[ApprovalOut.of(a) for a in found])


@router.post(
    "/{approval_id}/decision",
    response_model=DecisionOut,
    responses=responses(400, 401, 403, 404, 409, 413, 415, 422),
    summary="Approve or reject one exact action",
)
def decide(
    approval_id: uuid.UUID, body: DecisionIn, principal: Caller, conn: Connection
) -> DecisionOut:
    # As the owner: the store re-reads the principal, checks its tenant and the approval's
    # required roles, and sends the decision to the workflow in one transaction.
    decided = approval_decide(
        conn,
        approval_id=approval_id,
        principal=principal,
        decision=body.decision,
        reason=body.reason,
    )
    return DecisionOut(outcome=decided.outcome.value, approval=ApprovalOut.of(decided.approval))
