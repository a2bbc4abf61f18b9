"""`ledgerloop db`: install, check and grant the database schema."""

from __future__ import annotations

import typer

from ledgerloop.cli.common import (
    connection,
    database_url,
    user_errors,
)

db_cli = typer.Typer(no_args_is_help=True, help="Install and check the database schema.")


@db_cli.command("upgrade")
@user_errors
def db_upgrade() -> None:
    """Install or upgrade DBOS's schema and Ledgerloop's (idempotent, safe to run concurrently)."""
    from ledgerloop.db.migrate import upgrade

    changed = upgrade(database_url())
    typer.echo("schema upgraded" if changed else "schema already current")


@db_cli.command("status")
@user_errors
def db_status() -> None:
    """Show the installed schema versions against the ones this code expects."""
    from ledgerloop.db.migrate import schema_state

    state = schema_state(database_url())
    typer.echo(
        f"dbos {state.dbos_current}/{state.dbos_latest}  "
        f"ledgerloop {state.ours_current or 'none'}/{state.ours_head}  "
        f"{'current' if state.up_to_date else 'outdated: run `ledgerloop db upgrade`'}"
    )
    for problem in state.dbos_objects:
        typer.echo(f"  {problem}")


@db_cli.command("grant")
@user_errors
def db_grant(
    role: str = typer.Argument(..., help="An existing database role (your application's)."),
) -> None:
    """Grant ROLE what SQL `ledgerloop.start_run` needs, and nothing more (run as an admin)."""
    from ledgerloop.runs.start import grant_start_run

    with connection() as conn:
        grant_start_run(conn, role)
    typer.echo(f"{role} may now call ledgerloop.start_run (as a tenant session under RLS)")
