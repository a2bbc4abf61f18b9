"""An idle worker's cost: statements and transactions per second on the database, CPU share.

A real `ledgerloop up --no-http --no-relay` process with nothing to do, after a warm-up
(BENCH_IDLE_WARMUP_S, default 65 s: DBOS polls its schedules every second for its first
minute); statements are counted by pg_stat_statements for the worker's database (every
statement of every connection; "statements" leaves out BEGIN and COMMIT, which are reported
apart), transactions by pg_stat_database, CPU from /proc. Targets: <= 5 statements/s, <= 1%
of a core. BENCH_IDLE_S sets the window (default 20 s).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import start_worker, stop_worker
from scripts.benchmarks.common import report, scripted
from scripts.benchmarks.fleet import (
    counted_database,
    cpu_seconds,
    database_load,
    fleet_env,
    reset_statements,
    top_statements,
)
from scripts.benchmarks.results import Baseline, publish, smoke

WINDOW_S = float(os.environ.get("BENCH_IDLE_S", "1" if smoke() else "20"))
WARMUP_S = float(os.environ.get("BENCH_IDLE_WARMUP_S", "0" if smoke() else "65"))
LOG = Path(tempfile.gettempdir()) / "ledgerloop-bench-idle.log"


def registered(url: str) -> bool:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM ledgerloop.executor").fetchone()
    return bool(row and row[0])


def main() -> None:
    with counted_database() as url, scripted("default: {turns: [{text: done}]}") as model:
        env = fleet_env(url, ANTHROPIC_BASE_URL=model.url)
        worker = start_worker(env, "--no-relay", log=LOG)
        try:
            wait_until(lambda: registered(url), timeout=60, interval=0.2)
            time.sleep(WARMUP_S)
            reset_statements(url)
            _, _, xacts0 = database_load(url)
            cpu0, t0 = cpu_seconds(worker.pid), time.monotonic()
            time.sleep(WINDOW_S)
            statements, brackets, xacts1 = database_load(url)
            cpu1, t1 = cpu_seconds(worker.pid), time.monotonic()
            top = top_statements(url)
        finally:
            stop_worker(worker)
    elapsed = t1 - t0
    # Less the readings' own: two statements and one transaction at each end.
    per_s = (statements - brackets - 2) / elapsed
    brackets_per_s = brackets / elapsed
    xacts = (xacts1 - xacts0 - 1) / elapsed
    cpu = (cpu1 - cpu0) / elapsed * 100
    report(
        f"idle worker over {elapsed:.0f} s (defaults)",
        [
            ("statements/s (BEGIN/COMMIT left out)", per_s, "target <= 5"),
            ("BEGIN/COMMIT/s", brackets_per_s, ""),
            ("transactions/s", xacts, ""),
            ("CPU (% of one core)", cpu, "target <= 1%"),
        ],
    )
    print("  most frequent statements (calls in the window):")
    for calls, query in top:
        print(f"    {calls:>6}  {query}")
    publish("idle", __doc__, Baseline("targets: <= 5 statements/s, <= 1% of a core"))


if __name__ == "__main__":
    main()
