"""What every `ledgerloop` command shares: one-line errors, the database, the console."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

import click
import psycopg
import sqlalchemy.exc
import typer

from ledgerloop.config import Settings, load_settings
from ledgerloop.errors import LedgerloopError

if TYPE_CHECKING:
    from ledgerloop.approvals.principals import Principal
    from ledgerloop.db.connect import Conn

F = TypeVar("F", bound=Callable[..., Any])

#: Exceptions that are the command line's own ways to end (an exit code, a usage error, an
#: abort), passed on untouched. typer 0.2x vendors click, so its Exit and its usage errors are
#: not the installed click's classes: both families are listed.
CLI_SIGNALS: tuple[type[BaseException], ...] = (
    typer.Exit,
    typer.Abort,
    typer.BadParameter.__mro__[1],  # (typer's) click.UsageError
    *(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"),
    click.exceptions.Exit,
    click.ClickException,
    click.Abort,
)


def user_errors(fn: F) -> F:
    """Turn LedgerloopErrors into one line and exit 2, never a traceback.

    A database error that escaped translation is translated here (a missing schema names
    `ledgerloop db upgrade`); anything else is one line and exit 1, with the traceback only
    under LEDGERLOOP_DEBUG=1.
    """

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            try:
                return fn(*args, **kwargs)
            except (psycopg.Error, sqlalchemy.exc.DBAPIError) as exc:
                from ledgerloop.db.errors import translated

                with translated(configured_url(), "reading"):
                    raise exc from None
                raise  # pragma: no cover - translated always raises
        except LedgerloopError as exc:
            typer.echo(f"error: {exc.one_line()}", err=True)
            raise typer.Exit(2) from None
        except CLI_SIGNALS:
            raise
        except Exception as exc:
            if os.environ.get("LEDGERLOOP_DEBUG"):
                raise
            message = " ".join(str(exc).split())[:300]
            typer.echo(
                f"error: unexpected {type(exc).__name__}: {message} (set LEDGERLOOP_DEBUG=1 "
                "to see the traceback)",
                err=True,
            )
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def configured_url() -> str:
    return load_settings().database_url or "postgresql://embedded"


def database_url(*, keep_running: bool = False) -> str:
    """The database URL; with none configured, the embedded Postgres, which one-shot commands
    stop on exit when they started it (`up`, `relay` and `demo` keep it running)."""
    from ledgerloop.db.provision import resolve_database_url

    return resolve_database_url(
        load_settings(), lambda line: typer.echo(line, err=True), keep_running=keep_running
    )


def reachable_database_url(settings: Settings) -> str:
    """For long-running processes: wait (bounded, announced once) for an unreachable database
    instead of exiting, so a worker started during a failover comes up when it returns."""
    from ledgerloop.db.wait import wait_for_database

    url = database_url(keep_running=True)
    wait_for_database(url, settings.startup_wait_s, lambda line: typer.echo(line, err=True))
    return url


# These act on the database directly, as its owner. Deciding an approval or resolving an
# effect also needs a person's token: the record names who decided, with which role.

AUTH_HELP = "Your token (from `ledgerloop approvers add`); or set LEDGERLOOP_TOKEN."
TENANT_HELP = "Only this tenant's rows (default: every tenant the database role sees)."


@contextmanager
def connection(tenant: uuid.UUID | None = None) -> Iterator[Conn]:
    """An autocommit connection; inside `tenant`'s scope (one transaction) when given."""
    from ledgerloop.db.connect import connect, tenant_scope
    from ledgerloop.db.errors import translated

    url = database_url()
    with connect(url, autocommit=True) as conn, translated(url, "reading"):
        if tenant is None:
            yield conn
        else:
            with tenant_scope(conn, tenant):
                yield conn


def authenticate(conn: Conn, token: str | None) -> Principal:
    from ledgerloop.approvals.errors import Unauthenticated
    from ledgerloop.approvals.principals import principal_authenticate

    if not token:
        raise Unauthenticated()
    return principal_authenticate(conn, token.strip())


def console() -> Any:
    # Made per command so it writes to the stdout of the moment (CliRunner swaps it). Into a
    # pipe or a file, rich would assume 80 columns and wrap ids: no width limit there.
    import sys

    from rich.console import Console

    width = None if sys.stdout.isatty() else 100_000
    return Console(highlight=False, width=width, soft_wrap=width is not None)


#: Columns never wrapped in a terminal: ids, keys and hashes are copied whole.
WHOLE = frozenset({"id", "run_id", "key", "action_hash", "worker"})


def _json_default(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def show_rows(
    records: list[dict[str, Any]],
    columns: list[tuple[str, str]],
    *,
    as_json: bool,
    empty: str,
) -> None:
    """`records` as one JSON document (a list) with --json, else as a table of `columns`
    (header, key). Every cell is plain text: data from models and users (a ticket titled
    `[/bold] disk`) is never read as rich markup."""
    if as_json:
        typer.echo(json.dumps(records, default=_json_default))
        return
    out = console()
    if not records:
        out.print(empty, markup=False)
        return
    from rich.table import Table
    from rich.text import Text

    cells = [[_cell(record.get(key)) for _, key in columns] for record in records]
    table = Table()
    for i, (header, key) in enumerate(columns):
        # In a terminal narrower than the table the other columns wrap; these keep their
        # width, and the lines run past the edge (crop=False) rather than lose a character.
        whole = max(len(row[i]) for row in cells) if key in WHOLE else None
        table.add_column(header, overflow="fold", min_width=whole)
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))
    out.print(table, crop=False)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if hasattr(value, "strftime"):
        return when(value)
    return str(value)


def when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"
