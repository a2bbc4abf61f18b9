"""Idle cost: a whole `ledgerloop up` (worker, relay, reconciler, HTTP) with nothing to do,
side by side with bare DBOS (scripts/benchmarks/idle_bare.py: one queue, one workflow
registered, nothing running), each on a database of its own in one throwaway cluster.

After a warm-up (BENCH_IDLE_WARMUP_S, default 65 s: DBOS polls its schedules every second
for its first minute), over a window (BENCH_IDLE_S, default 30 s), per database:

- statements/s: pg_stat_statements calls of every connection (`track = all`, utility
  statements included), BEGIN, COMMIT and ROLLBACK counted too (and also reported apart);
- WAL commits/s: commit records in the WAL written over the window (pg_waldump), each
  attributed to the database whose relations its transaction changed. A transaction that
  writes nothing gets no commit record, so these are the commits that wrote WAL;
- WAL bytes/s: records of the window that name a relation of the database (commits
  included; pruning by readers too);
- CPU of the process, % of one core.

Targets for `ledgerloop up`: <= 5 statements/s, 0 WAL commits/s.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from ledgerloop.db.cluster import free_port
from ledgerloop.db.connect import connect
from ledgerloop.runs.start import start_run
from ledgerloop.runs.states import TERMINAL
from ledgerloop.runs.store import run_require
from ledgerloop.testing.idle_cost import (
    counting_cluster,
    database_oid,
    reset_statements,
    statements,
    top_statements,
    wal_by_database,
    wal_lsn,
)
from ledgerloop.testing.postgres import DatabaseFactory, wait_until
from ledgerloop.testing.processes import REPO, stop_all
from scripts.benchmarks import results
from scripts.benchmarks.common import report, scripted
from scripts.benchmarks.fleet import cpu_seconds, fleet_env

WINDOW_S = float(results.size("BENCH_IDLE_S", "30", "1"))
WARMUP_S = float(results.size("BENCH_IDLE_WARMUP_S", "65", "0"))
LOG = Path(tempfile.gettempdir()) / "ledgerloop-bench-idle.log"
LATENCY_PAIRS = 3


def registered(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM ledgerloop.executor").fetchone()
    return bool(row and row[0])


def resting(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT bool_and(resting_since IS NOT NULL) FROM ledgerloop.executor"
        ).fetchone()
    return bool(row and row[0])


def first_step_ms(conn: psycopg.Connection[Any]) -> float:
    """From a SQL `start_run`'s commit to its first step's start, as DBOS journals it."""
    with conn.transaction():
        run_id = start_run(conn, agent="ops", input={"message": "from rest"})
    committed_ms = time.time() * 1000

    def first_step() -> object:
        row = conn.execute(
            "SELECT started_at_epoch_ms FROM dbos.operation_outputs "
            "WHERE workflow_uuid = %s AND function_id = 1",
            (str(run_id),),
        ).fetchone()
        conn.commit()
        return row

    row = wait_until(first_step, timeout=30, interval=0.002)
    wait_until(lambda: run_require(conn, run_id).status in TERMINAL, timeout=30, interval=0.01)
    return float(row["started_at_epoch_ms"]) - committed_ms  # type: ignore[index]


def start_latencies(url: str) -> tuple[list[float], list[float]]:
    """A run started while the worker rests (it heartbeats before it claims), then one right
    after, while it is awake: LATENCY_PAIRS of each."""
    from_rest: list[float] = []
    awake: list[float] = []
    with connect(url) as conn:
        for _ in range(LATENCY_PAIRS):
            wait_until(lambda: resting(url), timeout=60, interval=0.2)
            from_rest.append(first_step_ms(conn))
            awake.append(first_step_ms(conn))
    return from_rest, awake


def running(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}: see {LOG}")


def main() -> None:
    with counting_cluster() as local, scripted("default: {turns: [{text: done}]}") as model:
        admin = local.url
        results.used_database(admin)
        factory = DatabaseFactory(admin)
        url = factory.create()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench_idle_bare")
        bare_url = admin.rsplit("/", 1)[0] + "/bench_idle_bare"
        env = fleet_env(url, ANTHROPIC_BASE_URL=model.url, LEDGERLOOP_HTTP_PORT=str(free_port()))
        with LOG.open("ab") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "ledgerloop.cli", "up"],
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            bare = subprocess.Popen(
                [sys.executable, "-m", "scripts.benchmarks.idle_bare", bare_url],
                env={**env, "PYTHONPATH": f"{REPO}:{env['PYTHONPATH']}"},
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(lambda: registered(url), timeout=90, interval=0.5)
            time.sleep(WARMUP_S)
            running(worker, bare)
            ours, theirs = database_oid(admin, url), database_oid(admin, bare_url)
            reset_statements(admin)
            lsn0 = wal_lsn(admin)
            cpu0 = {p.pid: cpu_seconds(p.pid) for p in (worker, bare)}
            t0 = time.monotonic()
            time.sleep(WINDOW_S)
            t1 = time.monotonic()
            cpu1 = {p.pid: cpu_seconds(p.pid) for p in (worker, bare)}
            counted = statements(admin)
            lsn1 = wal_lsn(admin)
            tops = {db: top_statements(admin, db) for db in (ours, theirs)}
            running(worker, bare)
            from_rest, awake = start_latencies(url)
        finally:
            stop_all(worker, bare)
        wal = wal_by_database(local, lsn0, lsn1)
    elapsed = t1 - t0
    rows: list[tuple[str, float, str]] = []
    for label, db, proc, target in (
        ("ledgerloop up", ours, worker, True),
        ("bare DBOS", theirs, bare, False),
    ):
        n, brackets = counted.get(db, (0, 0))
        commits, size = wal.get(db, (0, 0))
        cpu = (cpu1[proc.pid] - cpu0[proc.pid]) / elapsed * 100
        rows += [
            (f"{label}: statements/s, all", n / elapsed, "target <= 5" if target else ""),
            (f"{label}:   of which BEGIN/COMMIT/ROLLBACK", brackets / elapsed, ""),
            (f"{label}: WAL commits/s", commits / elapsed, "target 0" if target else ""),
            (f"{label}: WAL bytes/s", size / elapsed, ""),
            (f"{label}: CPU (% of one core)", cpu, ""),
        ]
    report(f"idle over {elapsed:.0f} s (defaults), side by side", rows)
    report(
        f"SQL start_run commit -> first step ({LATENCY_PAIRS} each)",
        [
            ("from rest, median (ms)", statistics.median(from_rest), "heartbeat, then claim"),
            ("awake (the run right after), median (ms)", statistics.median(awake), "baseline"),
        ],
    )
    for label, db in (("ledgerloop up", ours), ("bare DBOS", theirs)):
        print(f"  {label}: most frequent statements (calls in the window):")
        for calls, query in tops[db]:
            print(f"    {calls:>6}  {query}")
    bare_n = counted.get(theirs, (0, 0))[0] / elapsed
    results.publish(
        "idle",
        __doc__,
        results.Baseline("bare DBOS idle, statements/s", bare_n, "statements/s"),
    )


if __name__ == "__main__":
    main()
