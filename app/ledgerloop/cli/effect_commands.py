"""`ledgerloop effects`: list effects; resolve the ones parked for a person."""

from __future__ import annotations

import uuid
from typing import Any

import typer

from ledgerloop.cli.common import (
    AUTH_HELP,
    TENANT_HELP,
    authenticate,
    connection,
    show_rows,
    user_errors,
)
from ledgerloop.effects.messages import EffectStatus
from ledgerloop.errors import LedgerloopError

effects_cli = typer.Typer(no_args_is_help=True, help="List effects; resolve the ones parked.")


@effects_cli.command("list")
@user_errors
def effects_list(
    status: EffectStatus | None = typer.Option(None, help="e.g. needs_human"),
    run: uuid.UUID | None = typer.Option(None, help="Only this run's effects."),
    limit: int = typer.Option(50, min=1, max=1000),
    tenant: uuid.UUID | None = typer.Option(None, help=TENANT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the list as one JSON document."),
) -> None:
    """Effects, newest first."""
    from ledgerloop.effects.ledger import effect_list

    with connection(tenant) as conn:
        found = effect_list(conn, status=status, run_id=run, limit=limit)
    records: list[dict[str, Any]] = [
        {
            "key": effect.key,
            "run_id": str(effect.run_id),
            "tool": effect.tool,
            "status": effect.status.value,
            "attempts": effect.attempts,
            "destination": effect.destination,
            "error": effect.error,
            "updated_at": effect.updated_at,
        }
        for effect in found
    ]
    table = [{**r, "error": (r["error"] or "")[:80]} for r in records]
    columns = [("key", "key"), ("tool", "tool"), ("status", "status")]
    columns += [("attempts", "attempts"), ("destination", "destination")]
    columns += [("error", "error"), ("updated", "updated_at")]
    show_rows(records if as_json else table, columns, as_json=as_json, empty="no effects")


@effects_cli.command("resolve")
@user_errors
def effects_resolve(
    key: str = typer.Argument(..., help="The effect's idempotency key."),
    succeeded: str | None = typer.Option(None, help="It happened: the downstream's reference."),
    failed: str | None = typer.Option(None, help="It did not happen: why."),
    retry: bool = typer.Option(False, "--retry", help="Try again automatically (if safe)."),
    token: str | None = typer.Option(None, envvar="LEDGERLOOP_TOKEN", help=AUTH_HELP),
) -> None:
    """Settle a needs_human or outcome_unknown effect (operator role)."""
    from ledgerloop.approvals.errors import Forbidden
    from ledgerloop.approvals.principals import OPERATOR
    from ledgerloop.db.connect import tenant_scope
    from ledgerloop.effects.ledger import effect_resolve

    if sum([succeeded is not None, failed is not None, retry]) != 1:
        raise LedgerloopError(
            "resolve needs exactly one decision",
            fix="pass one of --succeeded REF, --failed REASON or --retry",
        )
    with connection() as conn:
        principal = authenticate(conn, token)
        if principal.role_for((OPERATOR,)) is None:
            raise Forbidden((OPERATOR,), principal.roles, "resolving effects")
        with tenant_scope(conn, principal.tenant_id):
            effect = effect_resolve(
                conn,
                key,
                succeeded_ref=succeeded,
                failed_reason=failed,
                retry=retry,
                operator=f"{principal.name} (principal {principal.id})",
            )
    detail = effect.external_reference or effect.error or ""
    typer.echo(f"effect {effect.key}: {effect.status.value}{f' ({detail})' if detail else ''}")
