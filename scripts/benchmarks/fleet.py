"""Shared set-up of the fleet benchmarks: a Postgres cluster of their own (with
pg_stat_statements, so statements can be counted), worker processes, and readings from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

import ledgerloop
from ledgerloop.db.cluster import LocalCluster
from ledgerloop.testing.postgres import DatabaseFactory
from ledgerloop.testing.processes import REPO, worker_env
from scripts.benchmarks.results import used_database


@contextmanager
def counted_database() -> Iterator[str]:
    """A fresh migrated database on a throwaway cluster that counts statements."""
    with tempfile.TemporaryDirectory(prefix="ledgerloop-bench-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster")
        cluster.init()
        with (cluster.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "pg_stat_statements.track = all\n"
                "max_connections = 300\n"
            )
        cluster.start()
        try:
            factory = DatabaseFactory(cluster.url)
            url = factory.create()
            used_database(url)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            yield url
        finally:
            cluster.destroy()


def database_load(url: str) -> tuple[int, int, int]:
    """(statements, of which BEGIN/COMMIT/ROLLBACK, transactions) counted in `url`'s
    database since the last statement reset (transactions: since the cluster started)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s "
            "        WHERE s.dbid = d.datid),"
            "       (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s "
            "        WHERE s.dbid = d.datid AND query IN ('BEGIN', 'COMMIT', 'ROLLBACK')),"
            "       xact_commit + xact_rollback "
            "FROM pg_stat_database d WHERE datname = current_database()"
        ).fetchone()
        conn.execute("SELECT pg_stat_clear_snapshot()")
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def top_statements(url: str, limit: int = 8) -> list[tuple[int, str]]:
    """The statements run most often in `url`'s database since the last reset."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT calls, regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database() "
            "ORDER BY calls DESC LIMIT %s",
            (limit,),
        ).fetchall()
    return [(int(calls), str(query)[:110]) for calls, query in rows]


def reset_statements(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def fleet_env(url: str, **extra: str) -> dict[str, str]:
    """A worker environment that runs the same ledgerloop source as this process (so a
    baseline can be measured by running the benchmark with an older checkout's `app/` first
    on PYTHONPATH)."""
    env = worker_env(url, **extra)
    env.pop("LEDGERLOOP_QUEUE_POLL_S", None)  # an older checkout's test setting: use defaults
    env["PYTHONPATH"] = f"{Path(ledgerloop.__file__).parents[1]}:{REPO}"
    return env


def executors(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM ledgerloop.executor").fetchall()]


def spawn_worker(
    env: dict[str, str], host: str, log: Path | None = None, *args: str
) -> subprocess.Popen[bytes]:
    """`ledgerloop up --no-http` in a UTS namespace of its own with host name `host`, as on a
    separate machine (host names and pids then say nothing about liveness)."""
    command = " ".join([sys.executable, "-m", "ledgerloop.cli", "up", "--no-http", *args])
    out = log.open("ab") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            ["unshare", "--uts", "sh", "-c", f"hostname {host} && exec {command}"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
