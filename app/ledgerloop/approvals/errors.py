"""Errors of the approval and principal paths, each with the HTTP status the API maps it to.

The API maps `status_code` directly, so no caller ever matches on message text. All of them
are non-retryable: the same request unchanged meets the same answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from ledgerloop.errors import LedgerloopError

if TYPE_CHECKING:
    from ledgerloop.approvals.records import Approval


class ApprovalError(LedgerloopError):
    """The approval request was refused."""

    status_code: ClassVar[int] = 400


class Unauthenticated(ApprovalError):
    """Invalid or revoked token."""

    status_code: ClassVar[int] = 401

    def __init__(self) -> None:
        # One message for malformed, unknown, wrong-secret and revoked tokens, so an attacker
        # learns nothing from the difference; the token itself is never echoed.
        super().__init__(fix="present a current token issued by `ledgerloop approvers add`")


class Forbidden(ApprovalError):
    """The principal lacks a role this action requires."""

    status_code: ClassVar[int] = 403

    def __init__(self, needed: tuple[str, ...], held: tuple[str, ...], action: str) -> None:
        self.needed = needed
        self.held = held
        super().__init__(
            f"{action} needs one of the roles {', '.join(needed)}; "
            f"this principal has {', '.join(held) or 'none'}",
            fix="use a principal with one of those roles",
        )


class ApprovalNotFound(ApprovalError):
    """No such approval."""

    status_code: ClassVar[int] = 404

    def __init__(self, approval_id: object) -> None:
        # Also raised for another tenant's approval: its existence is not revealed.
        super().__init__(f"no approval {approval_id}", fix="check the id")


class ApprovalConflict(ApprovalError):
    """The approval cannot take this decision in its current state."""

    status_code: ClassVar[int] = 409

    def __init__(self, message: str, *, state: str, current: Approval | None = None) -> None:
        #: What blocked the decision: an approval status ("approved", "expired", ...) or
        #: "run_<status>" when the run is no longer waiting for it.
        self.state = state
        self.current = current
        super().__init__(message, fix="reload the approval; decide only pending approvals")


class ApprovalUndeliverable(ApprovalError):
    """The run's workflow does not exist, so the decision cannot reach it."""

    status_code: ClassVar[int] = 409


class InvalidApprovalInput(ApprovalError):
    """An argument to an approval or principal call is invalid."""

    status_code: ClassVar[int] = 422
