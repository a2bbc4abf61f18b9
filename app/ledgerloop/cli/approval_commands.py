"""`ledgerloop approvals` and `ledgerloop approvers`: decisions and the people who make them."""

from __future__ import annotations

import uuid

import typer

from ledgerloop.approvals.store import ApprovalStatus
from ledgerloop.cli.common import (
    AUTH_HELP,
    TENANT_HELP,
    authenticate,
    connection,
    console,
    user_errors,
    when,
)
from ledgerloop.config import DEFAULT_TENANT

approvals_cli = typer.Typer(no_args_is_help=True, help="List approvals; approve or reject one.")
approvers_cli = typer.Typer(no_args_is_help=True, help="Principals: the tokens people act with.")


@approvals_cli.command("list")
@user_errors
def approvals_list(
    status: ApprovalStatus | None = typer.Option(ApprovalStatus.PENDING, help="Filter."),
    run: uuid.UUID | None = typer.Option(None, help="Only this run's approvals."),
    limit: int = typer.Option(50, min=1, max=1000),
    tenant: uuid.UUID | None = typer.Option(None, help=TENANT_HELP),
) -> None:
    """Approvals, newest first (pending ones unless --status says otherwise)."""
    from rich.table import Table

    from ledgerloop.approvals.store import approval_list

    with connection(tenant) as conn:
        found = approval_list(conn, status=status, run_id=run, limit=limit)
    table = Table("id", "tool", "summary", "status", "action hash", "expires")
    for approval in found:
        table.add_row(
            str(approval.id),
            approval.tool,
            str(approval.preview.get("summary", "")),
            approval.status.value,
            approval.action_hash,
            when(approval.expires_at),
        )
    console().print(table if found else "no approvals")


def _decide(approval_id: uuid.UUID, decision: str, token: str | None, reason: str | None) -> None:
    from ledgerloop.approvals.store import approval_decide
    from ledgerloop.runs.store import Outcome

    with connection() as conn:
        principal = authenticate(conn, token)
        decided = approval_decide(
            conn, approval_id=approval_id, principal=principal, decision=decision, reason=reason
        )
    approval = decided.approval
    again = " (already recorded)" if decided.outcome is Outcome.DUPLICATE else ""
    typer.echo(
        f"{approval.status.value}: approval {approval.id} ({approval.tool}, action "
        f"{approval.action_hash}) by {approval.decided_by_name}{again}"
    )


@approvals_cli.command("approve")
@user_errors
def approvals_approve(
    approval_id: uuid.UUID = typer.Argument(...),
    token: str | None = typer.Option(None, envvar="LEDGERLOOP_TOKEN", help=AUTH_HELP),
    reason: str | None = typer.Option(None, help="Why (kept with the decision)."),
) -> None:
    """Approve one exact action (its hash is in `approvals list`)."""
    _decide(approval_id, "approve", token, reason)


@approvals_cli.command("reject")
@user_errors
def approvals_reject(
    approval_id: uuid.UUID = typer.Argument(...),
    token: str | None = typer.Option(None, envvar="LEDGERLOOP_TOKEN", help=AUTH_HELP),
    reason: str | None = typer.Option(None, help="Why (the agent may be told)."),
) -> None:
    """Reject one action."""
    _decide(approval_id, "reject", token, reason)


@approvers_cli.command("add")
@user_errors
def approvers_add(
    name: str = typer.Argument(..., help="Who holds the token, e.g. an email address."),
    role: list[str] = typer.Option(
        ..., "--role", help="approver, operator, runner, viewer, or a policy's own (repeatable)."
    ),
    tenant: uuid.UUID = typer.Option(DEFAULT_TENANT, help="The tenant the principal acts in."),
) -> None:
    """Create a principal and print its token: shown once, stored only as a hash."""
    from ledgerloop.approvals.principals import principal_create

    with connection() as conn:
        principal, token = principal_create(conn, name=name, roles=role, tenant_id=tenant)
    typer.echo(
        f"principal {principal.id} ({principal.name}; roles {', '.join(principal.roles)}); "
        "its token follows, shown this once:",
        err=True,
    )
    typer.echo(token)
