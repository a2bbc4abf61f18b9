"""The long-running commands (`up`, `relay`, the demo and its servers) and `workers`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ledgerloop.cli.common import (
    connection,
    database_url,
    reachable_database_url,
    show_rows,
    user_errors,
)
from ledgerloop.config import load_settings


def _log_to_stderr() -> None:
    """Ledgerloop's own log lines (takeovers, recovery, drains) on stderr, at
    LEDGERLOOP_LOG_LEVEL (INFO); DBOS's stay at LEDGERLOOP_DBOS_LOG_LEVEL (WARNING)."""
    import logging
    import os
    import sys

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("ledgerloop")
    logger.addHandler(handler)
    logger.setLevel(os.environ.get("LEDGERLOOP_LOG_LEVEL", "INFO").upper())
    logger.propagate = False


@user_errors
def up(
    http: bool = typer.Option(True, help="Serve the HTTP API and the approval page."),
    relay: bool = typer.Option(True, help="Run the outbox relay and the reconciler."),
    trace_console: bool = typer.Option(False, help="Print spans to the console."),
) -> None:
    """Run a worker: the agent workflows, recovery, and (by default) relay and HTTP API."""
    import asyncio

    from ledgerloop.services import build_services, listened_channels
    from ledgerloop.worker import WorkerOptions, run_worker

    settings = load_settings()
    # A cap below this process's minimum is refused before anything connects.
    shape = settings.footprint("up", relay=relay)
    _log_to_stderr()
    url = reachable_database_url(settings)
    options = WorkerOptions(
        trace_console=trace_console,
        services=build_services(settings, http=http, relay=relay),
        footprint=shape,
        channels=listened_channels(http=http, relay=relay),
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


@user_errors
def workers(
    as_json: bool = typer.Option(False, "--json", help="Print the list as one JSON document."),
) -> None:
    """The workers on this database: identity, host, versions, heartbeat age, runs executing."""
    from ledgerloop.fleet.views import workers_list

    settings = load_settings()
    with connection() as conn:
        found = workers_list(conn)
    records: list[dict[str, Any]] = [
        {
            "worker": worker.id,
            "hostname": worker.hostname,
            "pid": worker.pid,
            "application_version": worker.application_version,
            "software_version": worker.software_version,
            "started_at": worker.started_at,
            "heartbeat_age_s": round(worker.heartbeat_age_s, 3),
            "alive": worker.alive(settings.stale_after_s),
            "resting": worker.resting,
            "runs_executing": worker.runs_executing,
        }
        for worker in found
    ]
    table = [
        {
            **r,
            "heartbeat": f"{r['heartbeat_age_s']:.1f} s ago"
            + (" (resting)" if r["resting"] else "" if r["alive"] else " (silent)"),
        }
        for r in records
    ]
    columns = [("worker", "worker"), ("host", "hostname"), ("pid", "pid")]
    columns += [("app version", "application_version"), ("ledgerloop", "software_version")]
    columns += [("started", "started_at"), ("heartbeat", "heartbeat"), ("runs", "runs_executing")]
    show_rows(records if as_json else table, columns, as_json=as_json, empty="no workers")


@user_errors
def demo() -> None:
    """Run the ops agent end to end (embedded Postgres and scripted model when unconfigured)."""
    from ledgerloop.demo import demo_succeeded, run_demo

    run = run_demo(load_settings(), database_url(keep_running=True), typer.echo)
    if not demo_succeeded(run):
        raise typer.Exit(1)


@user_errors
def relay() -> None:
    """Run only the outbox relay and the reconciler (no workflows, no HTTP)."""
    import asyncio
    import signal

    from ledgerloop.db.capacity import check_room
    from ledgerloop.db.footprint import minimum, name_executor
    from ledgerloop.effects.reconciler import run_reconciler
    from ledgerloop.effects.relay import run_relay
    from ledgerloop.telemetry import configure_telemetry
    from ledgerloop.tools.policy import load_policy

    settings = load_settings()
    shape = settings.footprint("relay")
    policy = load_policy(settings.policy_file)
    targets = {**policy.destination_urls(), **settings.destinations}
    mcp = policy.mcp_servers
    url = reachable_database_url(settings)
    name_executor(settings.executor_id)
    check_room(url, shape, minimum("relay"))
    # Deliveries and settlements are spans of the runs they belong to.
    configure_telemetry()
    from ledgerloop.db.pooling import session_url
    from ledgerloop.services import relay_config

    config = relay_config(settings, listening=session_url(url) is not None)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        typer.echo(f"ledgerloop relay up; destinations: {', '.join(targets) or 'none'}", err=True)
        await asyncio.gather(
            run_relay(url, targets, stop=stop, config=config, mcp_servers=mcp),
            run_reconciler(
                url,
                targets,
                stop=stop,
                interval_s=settings.reconcile_interval_s,
                mcp_servers=mcp,
            ),
        )

    asyncio.run(main())


@user_errors
def scripted_model(
    script: Path = typer.Option(..., exists=False, help="The YAML script to answer with."),
    port: int = typer.Option(8765, help="Port on 127.0.0.1 (0 picks a free one)."),
    host: str = typer.Option("127.0.0.1"),
    log: Path | None = typer.Option(None, help="Append every request here as JSON lines."),
    rpm_limit: int | None = typer.Option(
        None, min=1, help="Answer 429 (with Retry-After) past this many requests a minute."
    ),
) -> None:
    """Serve the scripted Messages API (POST /v1/messages) for demos and tests."""
    from ledgerloop.models.script import load_script
    from ledgerloop.models.scripted_server import serve

    load_script(script)  # a bad script is one clear error before anything listens
    serve(script, host, port, log, rpm_limit)


@user_errors
def ticket_service(
    port: int = typer.Option(8765, help="Port on 127.0.0.1."),
    host: str = typer.Option("127.0.0.1"),
) -> None:
    """Serve the example ticket service (a real downstream with fault switches)."""
    from ledgerloop.examples.ticket_service import serve

    serve(host, port)
