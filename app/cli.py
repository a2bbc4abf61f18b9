"""The `ledgerloop` command. Every user-facing failure is one line on stderr and exit code 2."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer

from app.config import load_settings
from app.errors import LedgerloopError

F = TypeVar("F", bound=Callable[..., Any])

cli = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
db_cli = typer.Typer(no_args_is_help=True, help="Install and check the database schema.")
cli.add_typer(db_cli, name="db")


def user_errors(fn: F) -> F:
    """Turn LedgerloopErrors into one line and exit 2, never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LedgerloopError as exc:
            typer.echo(f"error: {exc.one_line()}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _database_url() -> str:
    from app.db.provision import resolve_database_url

    return resolve_database_url(load_settings(), lambda line: typer.echo(line, err=True))


@db_cli.command("upgrade")
@user_errors
def db_upgrade() -> None:
    """Install or upgrade DBOS's schema and Ledgerloop's (idempotent, safe to run concurrently)."""
    from app.db.migrate import upgrade

    changed = upgrade(_database_url())
    typer.echo("schema upgraded" if changed else "schema already current")


@db_cli.command("status")
@user_errors
def db_status() -> None:
    """Show the installed schema versions against the ones this code expects."""
    from app.db.migrate import schema_state

    state = schema_state(_database_url())
    typer.echo(
        f"dbos {state.dbos_current}/{state.dbos_latest}  "
        f"ledgerloop {state.ours_current or 'none'}/{state.ours_head}  "
        f"{'current' if state.up_to_date else 'outdated: run `ledgerloop db upgrade`'}"
    )


def main() -> None:
    cli(prog_name="ledgerloop")


if __name__ == "__main__":  # pragma: no cover
    main()
