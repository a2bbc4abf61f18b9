"""`ledgerloop schedules`: list the fleet's schedules; pause, resume or trigger one.

Like `runs start` and `runs cancel`, these act on the database directly: reaching it is the
authority. Operators without database access use the HTTP API (operator role).
"""

from __future__ import annotations

import uuid
from typing import Any

import typer

from ledgerloop.cli.common import TENANT_HELP, connection, show_rows, user_errors

schedules_cli = typer.Typer(
    no_args_is_help=True, help="List schedules; pause, resume or trigger one."
)


def _record(row: Any) -> dict[str, Any]:
    return {
        "name": row.name,
        "agent": row.agent,
        "cron": row.cron,
        "timezone": row.timezone,
        "missed": row.missed,
        "paused": row.paused,
        "last_tick": row.last_tick,
        "last_run_id": str(row.last_run_id) if row.last_run_id else None,
        "tenant_id": str(row.tenant_id),
        "declared_at": row.declared_at,
    }


@schedules_cli.command("list")
@user_errors
def schedules_list(
    tenant: uuid.UUID | None = typer.Option(None, help=TENANT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the list as one JSON document."),
) -> None:
    """Every schedule a worker has declared, paused or not."""
    from ledgerloop.schedules.store import schedule_list

    with connection(tenant) as conn:
        records = [_record(row) for row in schedule_list(conn)]
    columns = [("name", "name"), ("agent", "agent"), ("cron", "cron"), ("zone", "timezone")]
    columns += [("paused", "paused"), ("last tick", "last_tick"), ("last run", "last_run_id")]
    show_rows(records, columns, as_json=as_json, empty="no schedules")


@schedules_cli.command("pause")
@user_errors
def schedules_pause(name: str = typer.Argument(..., help="The schedule's name.")) -> None:
    """Make no more runs until resumed."""
    from ledgerloop.schedules.store import schedule_set_paused

    with connection() as conn:
        schedule_set_paused(conn, name, True)
    typer.echo(f"schedule {name} paused")


@schedules_cli.command("resume")
@user_errors
def schedules_resume(name: str = typer.Argument(..., help="The schedule's name.")) -> None:
    """Run again from the next tick (the ticks of the pause are not caught up)."""
    from ledgerloop.schedules.store import schedule_set_paused

    with connection() as conn:
        schedule_set_paused(conn, name, False)
    typer.echo(f"schedule {name} resumed")


@schedules_cli.command("trigger")
@user_errors
def schedules_trigger(
    name: str = typer.Argument(..., help="The schedule's name."),
    key: str | None = typer.Option(None, "--key", help="Idempotency key: a repeat is a no-op."),
) -> None:
    """Start a run of the schedule now, with its input; prints the run's id."""
    from ledgerloop.schedules.store import schedule_trigger

    with connection() as conn:
        run_id = schedule_trigger(conn, name, key)
    typer.echo(str(run_id))
