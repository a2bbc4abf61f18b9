"""What a newcomer types into LEDGERLOOP_DATABASE_URL, through the real `ledgerloop` command:
a URL with nothing in it, a wrong password, and several hosts for a failover pair."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from ledgerloop.cli import cli
from ledgerloop.db.cluster import LocalCluster, free_port
from ledgerloop.testing.postgres import DatabaseFactory, wait_until
from ledgerloop.testing.processes import start_worker, stop_worker, worker_env

pytestmark = pytest.mark.e2e

PASSWORD = "right-horse-battery"
WRONG = "wrong-staple-42"


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERLOOP_", "PG"))}
    env["LEDGERLOOP_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "ledgerloop.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("url", ["postgres://", "postgresql://", "postgresql:///"])
def test_a_url_without_host_or_database_is_refused_not_filled_with_defaults(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGERLOOP_DATABASE_URL", url)
    result = CliRunner().invoke(cli, ["runs", "list"])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: LEDGERLOOP_DATABASE_URL names no host"), line
    assert "postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME" in line


@pytest.fixture(scope="module")
def password_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A Postgres of its own that asks role `alice` for her password (the shared test server
    trusts everyone, so it cannot refuse one)."""
    cluster = LocalCluster(tmp_path_factory.mktemp("password-pg"))
    cluster.init()
    hba = cluster.data_dir / "pg_hba.conf"
    hba.write_text("host all alice 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    cluster.start()
    try:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE alice LOGIN PASSWORD '{PASSWORD}'")
        yield cluster
    finally:
        cluster.stop()


def test_a_wrong_password_is_an_authentication_failure_naming_the_user(
    password_server: LocalCluster,
) -> None:
    port = password_server.port
    right = f"postgresql://alice:{PASSWORD}@127.0.0.1:{port}/postgres"
    with psycopg.connect(right) as conn:  # the password works: only a wrong one is refused
        assert conn.execute("SELECT current_user").fetchone() == ("alice",)
    dead = free_port()
    for command, hosts in (
        (["runs", "list"], f"127.0.0.1:{port}"),
        (["db", "upgrade"], f"127.0.0.1:{port}"),
        # The refusal comes second, after the dead first host's failure.
        (["runs", "list"], f"127.0.0.1:{dead},127.0.0.1:{port}"),
    ):
        result = _cli(f"postgresql://alice:{WRONG}@{hosts}/postgres", *command)
        line = _one_line(result)
        assert "refused user 'alice'" in line, line
        assert "password authentication failed" in line, line
        assert "cannot reach" not in line
        assert WRONG not in result.stdout + result.stderr


def test_two_hosts_the_first_dead_still_connect(
    db_factory: DatabaseFactory, tmp_path: Path
) -> None:
    url = db_factory.create(migrated=False)
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
        dead = free_port()  # nothing listens: libpq moves on to the next host
        auth = info["user"] + (f":{info['password']}" if info.get("password") else "")
        hosts = f"{info['host']}:{dead},{info['host']}:{info['port']}"
        two_hosts = f"postgresql://{auth}@{hosts}/{info['dbname']}"
        for query in ("?target_session_attrs=read-write", "?connect_timeout=5"):
            # The authority form, then the query-parameter form of the same pair.
            result = _cli(two_hosts + query, "db", "upgrade")
            assert result.returncode == 0, result.stdout + result.stderr
            assert result.stdout.strip() in ("schema upgraded", "schema already current")
        query_form = (
            f"postgresql://{auth}@/{info['dbname']}?host={info['host']},{info['host']}"
            f"&port={dead},{info['port']}&target_session_attrs=read-write"
        )
        status = _cli(query_form, "db", "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "current" in status.stdout
        assert "outdated" not in status.stdout
        listed = _cli(two_hosts + "?target_session_attrs=read-write", "runs", "list")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        assert "no runs" in listed.stdout

        # A worker: DBOS reads the URL through SQLAlchemy, which refused the authority form.
        log = tmp_path / "worker.log"
        env = worker_env(
            two_hosts + "?target_session_attrs=read-write", ANTHROPIC_BASE_URL="http://127.0.0.1:9"
        )
        proc = start_worker(env, "--no-relay", log=log)
        try:
            wait_until(lambda: proc.poll() is None and " up" in log.read_text(), timeout=90)
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM ledgerloop.executor").fetchone()
            assert row == (1,), log.read_text()  # it registered through the two-host URL
        finally:
            stop_worker(proc)
        assert proc.returncode == 0, log.read_text()
    finally:
        db_factory.drop(url)
