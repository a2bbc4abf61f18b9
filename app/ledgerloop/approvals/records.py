"""The approval record and its statuses: plain data, shared by the store and its errors."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"
    CANCELLED = "cancelled"


#: Columns some queries compute beside the row's own.
_COMPUTED = frozenset({"past_expiry", "remaining_s"})


@dataclass(frozen=True)
class Approval:
    id: uuid.UUID
    run_id: uuid.UUID
    tenant_id: uuid.UUID
    tool: str
    tool_call_id: str
    action_hash: str
    preview: dict[str, Any]
    policy_version: str
    required_roles: tuple[str, ...]
    requested_at: datetime
    expires_at: datetime | None
    status: ApprovalStatus
    decided_by_principal: uuid.UUID | None
    decided_by_name: str | None
    auth_token_id: uuid.UUID | None
    auth_role: str | None
    decision: str | None
    reason: str | None
    decided_at: datetime | None
    closed_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Approval:
        fields = {k: v for k, v in row.items() if k not in _COMPUTED}
        return cls(
            **{
                **fields,
                "status": ApprovalStatus(row["status"]),
                "required_roles": tuple(row["required_roles"]),
            }
        )
