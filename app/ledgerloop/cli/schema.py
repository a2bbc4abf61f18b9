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
    _connections()


def _connections() -> None:
    """Ledgerloop's connections on the server (pg_stat_activity, by application_name)
    against max_connections, and by process."""
    from ledgerloop.config import load_settings
    from ledgerloop.db.capacity import ledgerloop_processes, read_capacity

    settings = load_settings()
    with connection() as conn:
        found = read_capacity(conn)
        processes = ledgerloop_processes(conn)
    typer.echo(
        f"connections: {found.ledgerloop} Ledgerloop's, {found.in_use} in all, of "
        f"max_connections {found.max_connections} ({found.reserved} reserved for "
        f"superusers); each process may hold {settings.max_connections} "
        "(LEDGERLOOP_MAX_CONNECTIONS)"
    )
    for process, count in processes:
        typer.echo(f"  {process}: {count}")


@db_cli.command("grant")
@user_errors
def db_grant(
    role: str = typer.Argument(..., help="An existing database role (your application's)."),
) -> None:
    """Let ROLE call SQL `ledgerloop.start_run`, and nothing else (run as the schema's owner)."""
    from ledgerloop.runs.start import grant_start_run

    with connection() as conn:
        grant_start_run(conn, role)
    typer.echo(f"{role} may now call ledgerloop.start_run (and no table or other function)")


@db_cli.command("roles")
@user_errors
def db_roles(
    sql: bool = typer.Option(False, "--sql", help="Print the SQL a DBA runs once."),
    runtime_role: str | None = typer.Option(
        None, "--for", help="The role that runs `ledgerloop up` (default: this one)."
    ),
) -> None:
    """The database roles Ledgerloop needs: none for the database owner; a scope role where
    a superuser or a BYPASSRLS role runs it (docs/security.md)."""
    from ledgerloop.db.roles import roles_sql, scope_state

    with connection() as conn:
        if sql:
            typer.echo(roles_sql(conn, runtime_role), nl=False)
            return
        state = scope_state(conn)
    need = "needs" if state.bypasses else "does not need"
    have = "exists" if state.present else "does not exist"
    typer.echo(f"{state.me} {need} the scope role {state.name}, which {have}")
