"""Approvals bound to the exact action, and the principals (tokens with roles) who decide them.

`store` keeps approval records and sends each decision to the run's workflow in the same
transaction; `principals` mints and checks tokens; `preview` renders what an approver reads;
`errors` carries the HTTP status each refusal maps to. docs/approvals.md is the long version.
"""

from ledgerloop.approvals.errors import (
    ApprovalConflict,
    ApprovalError,
    ApprovalNotFound,
    ApprovalUndeliverable,
    Forbidden,
    InvalidApprovalInput,
    Unauthenticated,
)
from ledgerloop.approvals.preview import render_preview
from ledgerloop.approvals.principals import (
    APPROVER,
    OPERATOR,
    RUNNER,
    VIEWER,
    Principal,
    principal_authenticate,
    principal_create,
    principal_get,
    principal_list,
    principal_revoke,
)
from ledgerloop.approvals.store import (
    Approval,
    ApprovalReading,
    ApprovalStatus,
    Decision,
    approval_cancel_for_run,
    approval_check,
    approval_decide,
    approval_expire,
    approval_get,
    approval_list,
    approval_request,
    approval_topic,
    decision_message,
)

__all__ = [
    "APPROVER",
    "OPERATOR",
    "RUNNER",
    "VIEWER",
    "Approval",
    "ApprovalConflict",
    "ApprovalError",
    "ApprovalNotFound",
    "ApprovalReading",
    "ApprovalStatus",
    "ApprovalUndeliverable",
    "Decision",
    "Forbidden",
    "InvalidApprovalInput",
    "Principal",
    "Unauthenticated",
    "approval_cancel_for_run",
    "approval_check",
    "approval_decide",
    "approval_expire",
    "approval_get",
    "approval_list",
    "approval_request",
    "approval_topic",
    "decision_message",
    "principal_authenticate",
    "principal_create",
    "principal_get",
    "principal_list",
    "principal_revoke",
    "render_preview",
]
