"""`ledgerloop deploy`: check the runs in flight against this code, adopt or stop them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from ledgerloop.cli.common import (
    database_url,
    user_errors,
)
from ledgerloop.config import load_settings

deploy_cli = typer.Typer(
    no_args_is_help=True,
    help="Versioned deploys: check the runs in flight against this code, adopt or stop them.",
)

POLICY_HELP = "The tool policy about to be deployed (default: LEDGERLOOP_POLICY_FILE)."
FROM_HELP = "Only runs pinned to this application version."


def _deploy_settings(policy: Path | None) -> Any:
    from ledgerloop.deploy.check import policy_override

    return policy_override(load_settings(), policy)


@deploy_cli.command("check")
@user_errors
def deploy_check_cmd(
    policy: Path | None = typer.Option(None, "--policy", help=POLICY_HELP),
    sample: int = typer.Option(20, min=0, max=10_000, help="Recently finished runs to replay."),
    strict: bool = typer.Option(
        False, "--strict", help="Also fail when a sampled finished run diverges."
    ),
    show_all: bool = typer.Option(False, "--all", help="List resumable runs too."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Replay the journals of the runs in flight against this code and policy; list every run
    that would not resume. Exit 0: all resumable; 1: some would not; 2: could not check."""
    import asyncio

    from ledgerloop.deploy.check import deploy_check

    settings = _deploy_settings(policy)
    report = asyncio.run(deploy_check(settings, database_url(), sample=sample))
    if as_json:
        typer.echo(json.dumps(report.to_json()))
    else:
        typer.echo(
            f"checked against version {report.target_version}, policy {report.policy_version}: "
            f"{len(report.in_flight)} runs in flight, {len(report.finished)} finished replayed"
        )
        for check in report.in_flight:
            if show_all or not check.verdict.resumable:
                mark = "ok" if check.verdict.resumable else "WOULD NOT RESUME"
                typer.echo(
                    f"  {check.run_id}  {check.version}  {check.workflow_status:<8} {mark}: "
                    f"{check.verdict.reason}"
                )
        for check in report.finished_diverging:
            typer.echo(f"  {check.run_id}  (finished)  diverges: {check.verdict.reason}")
        blocked = len(report.blocked)
        typer.echo(
            f"{blocked} of {len(report.in_flight)} in-flight runs would not resume; "
            f"{len(report.finished_diverging)} of {len(report.finished)} finished runs diverge"
        )
    if not report.passed(strict=strict):
        raise typer.Exit(1)


@deploy_cli.command("adopt")
@user_errors
def deploy_adopt_cmd(
    policy: Path | None = typer.Option(None, "--policy", help=POLICY_HELP),
    from_version: str | None = typer.Option(None, "--from", help=FROM_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Move the in-flight runs of other versions that this code can resume (checked again by
    replay) to this process's application version, for its workers to resume."""
    import asyncio

    from ledgerloop.deploy.adopt import deploy_adopt

    settings = _deploy_settings(policy)
    report = asyncio.run(deploy_adopt(settings, database_url(), from_version=from_version))
    if as_json:
        typer.echo(json.dumps(report.to_json()))
        return
    typer.echo(
        f"adopted {len(report.adopted)} runs into {report.target_version}; "
        f"{len(report.incompatible)} would not resume (left to their version's workers, or "
        f"`ledgerloop deploy stop-incompatible`); {len(report.busy)} still executing on a live "
        f"worker or changed since the check (adopt again later); {report.current} already on "
        f"{report.target_version}"
    )
    for check in report.incompatible:
        typer.echo(f"  {check.run_id}  {check.version}  would not resume: {check.verdict.reason}")


@deploy_cli.command("stop-incompatible")
@user_errors
def deploy_stop_incompatible_cmd(
    policy: Path | None = typer.Option(None, "--policy", help=POLICY_HELP),
    from_version: str | None = typer.Option(None, "--from", help=FROM_HELP),
    requested_by: str = typer.Option(
        "operator (ledgerloop deploy stop-incompatible)", "--by", help="Who asks (recorded)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print what was stopped as JSON."),
) -> None:
    """Cancel every in-flight run this code would not resume, with the reason
    `incompatible_deploy` and where its journal diverges (recorded in its history)."""
    import asyncio

    from ledgerloop.deploy.adopt import deploy_stop_incompatible

    settings = _deploy_settings(policy)
    stopped = asyncio.run(
        deploy_stop_incompatible(
            settings, database_url(), requested_by=requested_by, from_version=from_version
        )
    )
    if as_json:
        typer.echo(json.dumps([{**s.check.to_json(), "stopped": s.stopped} for s in stopped]))
        return
    for s in stopped:
        what = "cancelled" if s.stopped else "already finished"
        typer.echo(f"  {s.check.run_id}  {s.check.version}  {what}: {s.check.verdict.reason}")
    typer.echo(f"stopped {sum(s.stopped for s in stopped)} runs (reason incompatible_deploy)")
