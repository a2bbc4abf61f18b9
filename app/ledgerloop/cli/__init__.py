"""The `ledgerloop` command. Every user-facing failure is one line on stderr and exit code 2.

Each group of subcommands is a module of this package; `common` holds what they share.
"""

from __future__ import annotations

import typer

from ledgerloop.cli import processes
from ledgerloop.cli.approval_commands import approvals_cli, approvers_cli
from ledgerloop.cli.common import user_errors
from ledgerloop.cli.deploy_commands import deploy_cli
from ledgerloop.cli.effect_commands import effects_cli
from ledgerloop.cli.exiting import process_ends_after
from ledgerloop.cli.run_commands import runs_cli
from ledgerloop.cli.schedule_commands import schedules_cli
from ledgerloop.cli.schema import db_cli

__all__ = ["cli", "main", "user_errors"]

cli = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Ledgerloop: durable, Postgres-native workflows for tool-using AI agents.",
)
cli.add_typer(db_cli, name="db")
cli.command("up")(processes.up)
cli.command("workers")(processes.workers)
cli.add_typer(runs_cli, name="runs")
cli.add_typer(approvals_cli, name="approvals")
cli.add_typer(approvers_cli, name="approvers")
cli.add_typer(effects_cli, name="effects")
cli.add_typer(schedules_cli, name="schedules")
cli.add_typer(deploy_cli, name="deploy")
cli.command("demo")(processes.demo)
cli.command("relay")(processes.relay)
cli.command("scripted-model")(processes.scripted_model)
cli.command("ticket-service")(processes.ticket_service)


def main() -> None:
    # A worker stopped during a database outage must still exit (cli/exiting.py).
    with process_ends_after():
        cli(prog_name="ledgerloop")
