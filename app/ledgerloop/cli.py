"""The `ledgerloop` command. Every user-facing failure is one line on stderr and exit code 2."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from ledgerloop.approvals.store import ApprovalStatus
from ledgerloop.config import DEFAULT_TENANT, load_settings
from ledgerloop.effects.messages import EffectStatus
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.states import RunStatus

if TYPE_CHECKING:
    from ledgerloop.approvals.principals import Principal
    from ledgerloop.db.connect import Conn

F = TypeVar("F", bound=Callable[..., Any])

cli = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Ledgerloop: durable, Postgres-native workflows for tool-using AI agents.",
)
db_cli = typer.Typer(no_args_is_help=True, help="Install and check the database schema.")
cli.add_typer(db_cli, name="db")
runs_cli = typer.Typer(no_args_is_help=True, help="Start runs, list them, show their timelines.")
cli.add_typer(runs_cli, name="runs")
approvals_cli = typer.Typer(no_args_is_help=True, help="List approvals; approve or reject one.")
cli.add_typer(approvals_cli, name="approvals")
approvers_cli = typer.Typer(no_args_is_help=True, help="Principals: the tokens people act with.")
cli.add_typer(approvers_cli, name="approvers")
effects_cli = typer.Typer(no_args_is_help=True, help="List effects; resolve the ones parked.")
cli.add_typer(effects_cli, name="effects")


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
    from ledgerloop.db.provision import resolve_database_url

    return resolve_database_url(load_settings(), lambda line: typer.echo(line, err=True))


@db_cli.command("upgrade")
@user_errors
def db_upgrade() -> None:
    """Install or upgrade DBOS's schema and Ledgerloop's (idempotent, safe to run concurrently)."""
    from ledgerloop.db.migrate import upgrade

    changed = upgrade(_database_url())
    typer.echo("schema upgraded" if changed else "schema already current")


@db_cli.command("status")
@user_errors
def db_status() -> None:
    """Show the installed schema versions against the ones this code expects."""
    from ledgerloop.db.migrate import schema_state

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

    from ledgerloop.services import build_services
    from ledgerloop.worker import WorkerOptions, run_worker

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


# -- runs, approvals, approvers, effects ----------------------------------------------------
# These act on the database directly, as its owner. Deciding an approval or resolving an
# effect also needs a person's token: the record names who decided, with which role.

AUTH_HELP = "Your token (from `ledgerloop approvers add`); or set LEDGERLOOP_TOKEN."
TENANT_HELP = "Only this tenant's rows (default: every tenant the database role sees)."


@contextmanager
def _connection(tenant: uuid.UUID | None = None) -> Iterator[Conn]:
    """An autocommit connection; inside `tenant`'s scope (one transaction) when given."""
    from ledgerloop.db.connect import connect, tenant_scope

    with connect(_database_url(), autocommit=True) as conn:
        if tenant is None:
            yield conn
        else:
            with tenant_scope(conn, tenant):
                yield conn


def _authenticate(conn: Conn, token: str | None) -> Principal:
    from ledgerloop.approvals.errors import Unauthenticated
    from ledgerloop.approvals.principals import principal_authenticate

    if not token:
        raise Unauthenticated()
    return principal_authenticate(conn, token.strip())


def _console() -> Any:
    from rich.console import Console

    # Made per command so it writes to the stdout of the moment (CliRunner swaps it).
    return Console(highlight=False)


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


@runs_cli.command("start")
@user_errors
def runs_start(
    agent: str = typer.Argument(..., help="A registered agent's name."),
    message: str | None = typer.Option(None, "--message", "-m", help="Input {'message': ...}."),
    input_json: str | None = typer.Option(None, "--input", help="The input as a JSON object."),
    key: str | None = typer.Option(None, "--key", help="Idempotency key: a repeat is a no-op."),
    tenant: uuid.UUID = typer.Option(DEFAULT_TENANT, help="The tenant the run belongs to."),
) -> None:
    """Start a run; prints its id."""
    from ledgerloop.agent.definition import agents, load_agent_modules
    from ledgerloop.runs.start import InvalidRunInput, start_run

    load_agent_modules(load_settings().agent_modules)
    if agent not in agents():
        raise InvalidRunInput(
            f"unknown agent {agent!r}; known agents: {', '.join(sorted(agents())) or 'none'}",
            fix="register it with LEDGERLOOP_AGENT_MODULES",
        )
    try:
        run_input = json.loads(input_json) if input_json is not None else {}
    except json.JSONDecodeError as exc:
        raise InvalidRunInput(f"--input is not valid JSON: {exc}") from None
    if not isinstance(run_input, dict):
        raise InvalidRunInput("--input must be a JSON object", fix="e.g. --input '{\"k\": 1}'")
    if message is not None:
        run_input["message"] = message
    with _connection() as conn:
        run_id = start_run(
            conn, agent=agent, input=run_input, idempotency_key=key, tenant_id=tenant
        )
    typer.echo(str(run_id))


@runs_cli.command("list")
@user_errors
def runs_list(
    status: RunStatus | None = typer.Option(None, help="Only runs in this status."),
    agent: str | None = typer.Option(None, help="Only this agent's runs."),
    limit: int = typer.Option(50, min=1, max=1000),
    tenant: uuid.UUID | None = typer.Option(None, help=TENANT_HELP),
) -> None:
    """The newest runs."""
    from rich.table import Table

    from ledgerloop.runs.store import run_list

    with _connection(tenant) as conn:
        runs = run_list(conn, status=status, agent=agent, limit=limit)
    table = Table("id", "agent", "status", "created", "updated")
    for run in runs:
        table.add_row(
            str(run.id), run.agent, run.status.value, _when(run.created_at), _when(run.updated_at)
        )
    _console().print(table if runs else "no runs")


@runs_cli.command("show")
@user_errors
def runs_show(
    run_id: uuid.UUID = typer.Argument(..., help="The run's id."),
    tenant: uuid.UUID | None = typer.Option(None, help=TENANT_HELP),
) -> None:
    """The run's timeline as a tree: events, steps, effects and approvals in time order."""
    from rich.markup import escape
    from rich.tree import Tree

    from ledgerloop.runs.timeline import dbos_client, run_timeline

    steps = dbos_client(_database_url())
    try:
        with _connection(tenant) as conn:
            timeline = run_timeline(conn, run_id, steps=steps)
    finally:
        steps.destroy()
    run = timeline.run
    tree = Tree(f"[bold]run {run.id}[/]  {escape(run.agent)}  [bold]{run.status.value}[/]")
    for entry in timeline.entries:
        status = f"  [{entry.status}]" if entry.status else ""
        node = tree.add(
            escape(f"{entry.at:%H:%M:%S.%f}"[:12] + f"  {entry.kind:<8} {entry.name}{status}")
        )
        for name, value in entry.detail.items():
            if value not in (None, {}, []):
                text = value if isinstance(value, str) else json.dumps(value, default=str)
                node.add(escape(f"{name}: {text[:200]}"))
    if timeline.truncated:
        tree.add("… more items than shown")
    _console().print(tree)


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

    with _connection(tenant) as conn:
        found = approval_list(conn, status=status, run_id=run, limit=limit)
    table = Table("id", "tool", "summary", "status", "action hash", "expires")
    for approval in found:
        table.add_row(
            str(approval.id),
            approval.tool,
            str(approval.preview.get("summary", "")),
            approval.status.value,
            approval.action_hash,
            _when(approval.expires_at),
        )
    _console().print(table if found else "no approvals")


def _decide(approval_id: uuid.UUID, decision: str, token: str | None, reason: str | None) -> None:
    from ledgerloop.approvals.store import approval_decide
    from ledgerloop.runs.store import Outcome

    with _connection() as conn:
        principal = _authenticate(conn, token)
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

    with _connection() as conn:
        principal, token = principal_create(conn, name=name, roles=role, tenant_id=tenant)
    typer.echo(
        f"principal {principal.id} ({principal.name}; roles {', '.join(principal.roles)}); "
        "its token follows, shown this once:",
        err=True,
    )
    typer.echo(token)


@effects_cli.command("list")
@user_errors
def effects_list(
    status: EffectStatus | None = typer.Option(None, help="e.g. needs_human"),
    run: uuid.UUID | None = typer.Option(None, help="Only this run's effects."),
    limit: int = typer.Option(50, min=1, max=1000),
    tenant: uuid.UUID | None = typer.Option(None, help=TENANT_HELP),
) -> None:
    """Effects, newest first."""
    from rich.table import Table

    from ledgerloop.effects.ledger import effect_list

    with _connection(tenant) as conn:
        found = effect_list(conn, status=status, run_id=run, limit=limit)
    table = Table("key", "tool", "status", "attempts", "destination", "error", "updated")
    for effect in found:
        table.add_row(
            effect.key,
            effect.tool,
            effect.status.value,
            str(effect.attempts),
            effect.destination,
            (effect.error or "")[:80],
            _when(effect.updated_at),
        )
    _console().print(table if found else "no effects")


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
    with _connection() as conn:
        principal = _authenticate(conn, token)
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


@cli.command("demo")
@user_errors
def demo() -> None:
    """Run the ops agent end to end (embedded Postgres and scripted model when unconfigured)."""
    from ledgerloop.demo import demo_succeeded, run_demo

    run = run_demo(load_settings(), _database_url(), typer.echo)
    if not demo_succeeded(run):
        raise typer.Exit(1)


@cli.command("relay")
@user_errors
def relay() -> None:
    """Run only the outbox relay and the reconciler (no workflows, no HTTP)."""
    import asyncio
    import signal

    from ledgerloop.effects.reconciler import run_reconciler
    from ledgerloop.effects.relay import RelayConfig, run_relay
    from ledgerloop.tools.policy import load_policy

    settings = load_settings()
    url = _database_url()
    targets = {**load_policy(settings.policy_file).destinations, **settings.destinations}
    config = RelayConfig(
        lease_margin_s=settings.relay_lease_margin_s,
        settle_after_s=settings.effect_settle_after_s,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        typer.echo(f"ledgerloop relay up; destinations: {', '.join(targets) or 'none'}", err=True)
        await asyncio.gather(
            run_relay(url, targets, stop=stop, config=config),
            run_reconciler(url, targets, stop=stop, interval_s=settings.reconcile_interval_s),
        )

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
    from ledgerloop.models.script import load_script
    from ledgerloop.models.scripted_server import serve

    load_script(script)  # a bad script is one clear error before anything listens
    serve(script, host, port, log)


@cli.command("ticket-service")
@user_errors
def ticket_service(
    port: int = typer.Option(8765, help="Port on 127.0.0.1."),
    host: str = typer.Option("127.0.0.1"),
) -> None:
    """Serve the example ticket service (a real downstream with fault switches)."""
    from ledgerloop.examples.ticket_service import serve

    serve(host, port)


def main() -> None:
    cli(prog_name="ledgerloop")


if __name__ == "__main__":  # pragma: no cover
    main()
