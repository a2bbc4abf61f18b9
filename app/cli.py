"""The `ledgerloop` command. Every user-facing failure is one line on stderr and exit code 2."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import typer

from app.config import load_settings
from app.errors import LedgerloopError

F = TypeVar("F", bound=Callable[..., Any])

cli = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Ledgerloop: durable, Postgres-native workflows for tool-using AI agents.",
)
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


@cli.command("up")
@user_errors
def up(
    http: bool = typer.Option(True, help="Serve the HTTP API and the approval page."),
    relay: bool = typer.Option(True, help="Run the outbox relay and the reconciler."),
    trace_console: bool = typer.Option(False, help="Print spans to the console."),
) -> None:
    """Run a worker: the agent workflows, recovery, and (by default) relay and HTTP API."""
    import asyncio

    from app.services import build_services
    from app.worker import WorkerOptions, run_worker

    settings = load_settings()
    url = _database_url()
    options = WorkerOptions(
        trace_console=trace_console, services=build_services(settings, http=http, relay=relay)
    )

    async def main() -> None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready(_: object) -> None:
            where = f" on http://{settings.http_host}:{settings.http_port}" if http else ""
            typer.echo(f"ledgerloop worker {settings.executor_id} up{where}", err=True)

        await run_worker(settings, url, stop, options, ready)

    asyncio.run(main())


@cli.command("scripted-model")
@user_errors
def scripted_model(
    script: Path = typer.Option(..., exists=False, help="The YAML script to answer with."),
    port: int = typer.Option(8765, help="Port on 127.0.0.1 (0 picks a free one)."),
    host: str = typer.Option("127.0.0.1"),
    log: Path | None = typer.Option(None, help="Append every request here as JSON lines."),
) -> None:
    """Serve the scripted Messages API (POST /v1/messages) for demos and tests."""
    from app.models.script import load_script
    from app.models.scripted_server import serve

    load_script(script)  # a bad script is one clear error before anything listens
    serve(script, host, port, log)


@cli.command("ticket-service")
@user_errors
def ticket_service(
    port: int = typer.Option(8765, help="Port on 127.0.0.1."),
    host: str = typer.Option("127.0.0.1"),
) -> None:
    """Serve the example ticket service (a real downstream with fault switches)."""
    from app.examples.ticket_service import serve

    serve(host, port)


def main() -> None:
    cli(prog_name="ledgerloop")


if __name__ == "__main__":  # pragma: no cover
    main()
