"""CLI read commands: one clear line instead of a traceback, and no Postgres left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledgerloop.cli import cli
from ledgerloop.db.cluster import free_port
from ledgerloop.db.embedded import is_running
from ledgerloop.testing.postgres import DatabaseFactory
from ledgerloop.testing.processes import REPO

pytestmark = pytest.mark.e2e

READ_COMMANDS = [
    ["runs", "list"],
    ["runs", "show", str(uuid.uuid4())],
    ["approvals", "list"],
    ["effects", "list"],
]


@pytest.fixture
def unmigrated_url(db_factory: DatabaseFactory) -> Iterator[str]:
    url = db_factory.create(migrated=False)
    yield url
    db_factory.drop(url)


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_read_command_on_a_database_without_the_schema_names_the_fix(
    command: list[str], unmigrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGERLOOP_DATABASE_URL", unmigrated_url)
    monkeypatch.delenv("LEDGERLOOP_DEBUG", raising=False)
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "ledgerloop db upgrade" in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_read_command_on_an_unreachable_database_is_one_line(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGERLOOP_DATABASE_URL", f"postgresql://u@127.0.0.1:{free_port()}/db")
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: cannot reach the database")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERLOOP_", "ANTHROPIC_"))}
    env.update({"PYTHONPATH": str(REPO), **extra})
    return env


def test_a_read_command_with_no_url_leaves_no_embedded_postgres_running(tmp_path: Path) -> None:
    home = tmp_path / ".ledgerloop"
    done = subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", "runs", "list"],
        env=_clean_env(LEDGERLOOP_HOME=str(home)),
        cwd=tmp_path,  # no dbos-config.yaml here: nothing names a database
        capture_output=True,
        text=True,
        timeout=120,
    )
    # A fresh embedded database has no schema yet: one line naming the fix.
    assert done.returncode == 2, done.stderr
    assert "ledgerloop db upgrade" in done.stderr
    assert "Traceback" not in done.stderr
    assert (home / "pgdata" / "PG_VERSION").exists()  # it was started...
    assert not is_running(home / "pgdata")  # ...and stopped with the command
