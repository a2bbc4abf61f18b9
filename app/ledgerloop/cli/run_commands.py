"""`ledgerloop runs`: start, list, show, cancel and purge runs; find stuck ones."""

from __future__ import annotations

import json
import uuid

import typer

from ledgerloop.cli.common import (
    TENANT_HELP,
    connection,
    console,
    database_url,
    show_rows,
    user_errors,
)
from ledgerloop.config import DEFAULT_TENANT, load_settings
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.states import RunStatus

runs_cli = typer.Typer(no_args_is_help=True, help="Start runs, list them, show their timelines.")


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
    with connection() as conn:
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
    as_json: bool = typer.Option(False, "--json", help="Print the list as one JSON document."),
) -> None:
    """The newest runs."""
    from ledgerloop.runs.store import run_list

    with connection(tenant) as conn:
        runs = run_list(conn, status=status, agent=agent, limit=limit)
    records = [
        {
            "id": str(run.id),
            "agent": run.agent,
            "status": run.status.value,
            "created_at": run.created_at,
            "updated_at": run.updated_at,
        }
        for run in runs
    ]
    columns = [("id", "id"), ("agent", "agent"), ("status", "status")]
    columns += [("created", "created_at"), ("updated", "updated_at")]
    show_rows(records, columns, as_json=as_json, empty="no runs")


@runs_cli.command("stuck")
@user_errors
def runs_stuck_command(
    limit: int = typer.Option(100, min=1, max=10_000),
    as_json: bool = typer.Option(False, "--json", help="Print the list as one JSON document."),
) -> None:
    """Runs that need a look: the run and its workflow disagree, the run is PENDING under a
    worker that is gone or silent, or it is queued for a version no live worker runs.
    Exits 1 when there are any (for monitoring), 0 when there are none (with --json too)."""
    from ledgerloop.fleet.views import runs_stuck

    settings = load_settings()
    with connection() as conn:
        stuck = runs_stuck(conn, stale_after_s=settings.stale_after_s, limit=limit)
    records = [
        {
            "run_id": str(run.run_id),
            "agent": run.agent,
            "run_status": run.run_status,
            "workflow_status": run.workflow_status,
            "worker": run.executor_id,
            "updated_at": run.updated_at,
            "problem": run.problem,
        }
        for run in stuck
    ]
    columns = [("run", "run_id"), ("agent", "agent"), ("run status", "run_status")]
    columns += [("workflow", "workflow_status"), ("worker", "worker")]
    columns += [("updated", "updated_at"), ("problem", "problem")]
    show_rows(records, columns, as_json=as_json, empty="no stuck runs")
    if stuck:
        raise typer.Exit(1)


@runs_cli.command("show")
@user_errors
def runs_show(
    run_id: uuid.UUID = typer.Argument(..., help="The run's id."),
    tenant: uuid.UUID | None = typer.Option(None, help=TENANT_HELP),
) -> None:
    """The run's timeline as a tree: events, steps, effects and approvals in time order."""
    from rich.markup import escape
    from rich.tree import Tree

    from ledgerloop.config import load_settings
    from ledgerloop.control.timeline import dbos_client, run_timeline

    prices = load_settings().model_prices
    # Our connection first: an unreachable database is then one line of ours, not DBOS's
    # client logging its own connection errors first.
    with connection(tenant) as conn:
        steps = dbos_client(database_url())
        try:
            timeline = run_timeline(conn, run_id, steps=steps, prices=prices)
        finally:
            steps.destroy()
    run = timeline.run
    cost = f"${timeline.cost_usd or 0:.4f}"
    if timeline.unpriced_calls:
        cost += f" + {timeline.unpriced_calls} unpriced model call(s)"
    tree = Tree(
        f"[bold]run {run.id}[/]  {escape(run.agent)}  [bold]{run.status.value}[/]  cost {cost}"
    )
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
    console().print(tree)


@runs_cli.command("cancel")
@user_errors
def runs_cancel(
    run_id: uuid.UUID = typer.Argument(..., help="The run's id."),
    reason: str | None = typer.Option(None, help="Why; kept in the run's history."),
) -> None:
    """Stop a run's pending work (approvals, undelivered effects, its workflow); undoes nothing."""
    import getpass

    from ledgerloop.control.cancel import cancel_run
    from ledgerloop.control.timeline import dbos_client

    workflows = dbos_client(database_url())
    try:
        with connection() as conn:
            done = cancel_run(
                conn,
                run_id,
                workflows=workflows,
                requested_by=f"{getpass.getuser()} (cli)",
                reason=reason,
            )
    finally:
        workflows.destroy()
    closed = len(done.approvals_cancelled)
    typer.echo(f"run {run_id} cancelled ({closed} pending approvals closed)")


@runs_cli.command("follow")
@user_errors
def runs_follow(
    run_id: uuid.UUID = typer.Argument(..., help="The run's id."),
    url: str = typer.Option(
        "http://127.0.0.1:8080", envvar="LEDGERLOOP_URL", help="The HTTP API's base URL."
    ),
    token: str = typer.Option(
        ..., envvar="LEDGERLOOP_TOKEN", help="A token (`ledgerloop approvers add` prints one)."
    ),
    after: int | None = typer.Option(None, help="Start after this event id."),
) -> None:
    """Print a run's events as they happen, until it finishes; resumes by itself after a
    dropped connection. Exit 0 when the run succeeded, 1 otherwise."""
    from ledgerloop.client import FINISHED, TEXT_DELTA, ApiError, Client, TextSoFar

    texts = TextSoFar()
    writing = False  # text was printed and its line is not ended yet

    def line(text: str) -> None:
        nonlocal writing
        if writing:
            typer.echo()
            writing = False
        typer.echo(text)

    try:
        with Client(url, token) as api:
            for event in api.events(str(run_id), after=after):
                if event.type == TEXT_DELTA:
                    if texts.add(event):
                        line(f"-- {event.step} runs again (attempt {event.attempt}): text anew")
                    typer.echo(event.text, nl=False)
                    writing = True
                elif event.type == FINISHED:
                    status = event.data.get("status")
                    line(f"run {run_id} finished: {status}")
                    raise typer.Exit(0 if status == "succeeded" else 1)
                elif event.durable:
                    where = f" ({event.step})" if event.step else ""
                    line(f"#{event.id} {event.type}{where}")
                else:
                    detail = event.data.get("tool")
                    what = f" {detail}" if detail else ""
                    line(f"   {event.type} {event.step} attempt {event.attempt}{what}")
    except ApiError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@runs_cli.command("send")
@user_errors
def runs_send(
    run_id: uuid.UUID = typer.Argument(..., help="The run's id."),
    text: str = typer.Argument(..., help="What to tell the agent."),
    key: str | None = typer.Option(
        None,
        "--key",
        help="The message's Idempotency-Key: send again with the same key to retry safely "
        "(default: a new key).",
    ),
    url: str = typer.Option(
        "http://127.0.0.1:8080", envvar="LEDGERLOOP_URL", help="The HTTP API's base URL."
    ),
    token: str = typer.Option(
        ..., envvar="LEDGERLOOP_TOKEN", help="A token of a principal with the runner role."
    ),
) -> None:
    """Send a running agent a message; it reads it at its next turn boundary (or in
    wait_for_message). Prints the message's id once it is durable."""
    from ledgerloop.client import ApiError, Client

    try:
        with Client(url, token) as api:
            sent = api.send_message(str(run_id), text, idempotency_key=key)
    except ApiError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"message {sent['id']} sent to run {run_id} (key {sent['idempotency_key']})")


@runs_cli.command("purge")
@user_errors
def runs_purge(
    finished_before: str = typer.Option(
        ...,
        "--finished-before",
        help="A timestamp (2026-01-31T00:00:00Z) or an age (30d, 12h, 90m): runs that "
        "finished before it are purged.",
    ),
    keep_audit: bool = typer.Option(
        False,
        "--keep-audit",
        help="Keep each run's record, events, approvals and effects; delete only its journal, "
        "messages and payloads.",
    ),
    batch_size: int = typer.Option(500, min=10, max=10_000, help="Runs per first batch."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Delete finished runs from both schemas, in short batches (safe while workers run)."""
    from ledgerloop.config import parse_cutoff
    from ledgerloop.retention.purge import PurgeClient, PurgeOptions, purge_finished

    try:
        cutoff = parse_cutoff(finished_before)
    except ValueError as exc:
        raise LedgerloopError(f"--finished-before: {exc}") from None
    client = PurgeClient(database_url())
    try:
        with connection() as conn:
            report = purge_finished(
                conn,
                client.dbos,
                cutoff,
                PurgeOptions(keep_audit=keep_audit, batch_size=batch_size),
            )
    finally:
        client.close()
    if as_json:
        typer.echo(json.dumps({"cutoff": cutoff.isoformat(), **report.to_json()}))
        return
    what = "journals of" if keep_audit else ""
    typer.echo(
        f"purged {what + ' ' if what else ''}{report.runs} runs finished before "
        f"{cutoff.isoformat()} in {report.elapsed_s:.2f} s "
        f"(longest transaction {report.longest_txn_s * 1000:.0f} ms); skipped "
        f"{report.skipped_active} whose workflow is still active, "
        f"{report.skipped_unsettled} with unsettled effects"
    )
