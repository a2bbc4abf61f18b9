"""`ledgerloop approvals` and `ledgerloop approvers`: decisions and the people who make them."""

from __future__ import annotations

import uuid
from typing import Any

import typer

from ledgerloop.approvals.store import ApprovalStatus
from ledgerloop.cli.common import (
    AUTH_HELP,
    TENANT_HELP,
    authenticate,
    connection,
    show_rows,
    user_errors,
)
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.errors import LedgerloopError

approvals_cli = typer.Typer(no_args_is_help=True, help="List approvals; approve or reject one.")
approvers_cli = typer.Typer(no_args_is_help=True, help="Principals: the tokens people act with.")


@approvals_cli.command("list")
@user_errors
def approvals_list(
    status: ApprovalStatus | None = typer.Option(ApprovalStatus.PENDING, help="Filter."),
    run: uuid.UUID | None = typer.Option(None, help="Only this run's approvals."),
    limit: int = typer.Option(50, min=1, max=1000),
    tenant: uuid.UUID | None = typer.Option(None, help=TENANT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the list as one JSON document."),
) -> None:
    """Approvals, newest first (pending ones unless --status says otherwise)."""
    from ledgerloop.approvals.store import approval_list

    with connection(tenant) as conn:
        found = approval_list(conn, status=status, run_id=run, limit=limit)
    records = [
        {
            "id": str(approval.id),
            "run_id": str(approval.run_id),
            "tool": approval.tool,
            "summary": str(approval.preview.get("summary", "")),
            "status": approval.status.value,
            "action_hash": approval.action_hash,
            "expires_at": approval.expires_at,
        }
        for approval in found
    ]
    columns = [("id", "id"), ("tool", "tool"), ("summary", "summary"), ("status", "status")]
    columns += [("action hash", "action_hash"), ("expires", "expires_at")]
    show_rows(records, columns, as_json=as_json, empty="no approvals")


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


@approvers_cli.command("list")
@user_errors
def approvers_list(
    revoked: bool = typer.Option(False, "--revoked", help="Include revoked principals."),
    tenant: uuid.UUID | None = typer.Option(None, help=TENANT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the list as one JSON document."),
) -> None:
    """Principals: id, name, roles, tenant, when created and revoked (never a token)."""
    from ledgerloop.approvals.principals import principal_list

    with connection() as conn:
        found = principal_list(conn, tenant_id=tenant, include_revoked=revoked)
    records: list[dict[str, Any]] = [
        {
            "id": str(p.id),
            "name": p.name,
            "roles": list(p.roles),
            "tenant_id": str(p.tenant_id),
            "created_at": p.created_at,
            "revoked_at": p.revoked_at,
        }
        for p in found
    ]
    table = [{**r, "roles": ", ".join(r["roles"])} for r in records]
    columns = [("id", "id"), ("name", "name"), ("roles", "roles"), ("tenant", "tenant_id")]
    columns += [("created", "created_at"), ("revoked", "revoked_at")]
    show_rows(records if as_json else table, columns, as_json=as_json, empty="no approvers")


@approvers_cli.command("revoke")
@user_errors
def approvers_revoke(
    who: str = typer.Argument(..., help="The principal's id, or its name when that is unique."),
) -> None:
    """Revoke a principal's token: the HTTP API and the CLI refuse it from now on."""
    from ledgerloop.approvals.principals import principal_get, principal_list, principal_revoke

    with connection() as conn:
        try:
            matches = [p for p in [principal_get(conn, uuid.UUID(who))] if p is not None]
        except ValueError:
            matches = [p for p in principal_list(conn, include_revoked=True) if p.name == who]
        active = [p for p in matches if p.revoked_at is None]
        if not matches:
            raise LedgerloopError(
                f"no approver {who!r}", fix="see `ledgerloop approvers list` for ids and names"
            )
        if len(active) > 1:
            ids = ", ".join(str(p.id) for p in active)
            raise LedgerloopError(
                f"{len(active)} approvers are named {who!r} ({ids})", fix="revoke one by its id"
            )
        if not active:
            typer.echo(f"approver {matches[0].id} ({matches[0].name}) was already revoked")
            return
        principal = active[0]
        principal_revoke(conn, principal.id)
    typer.echo(f"revoked approver {principal.id} ({principal.name}); its token no longer works")
