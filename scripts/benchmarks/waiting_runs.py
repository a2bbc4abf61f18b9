"""Many runs waiting for approval on one worker: resident memory and threads.

Runs are async DBOS workflows, so a run parked in `awaiting_approval` holds no thread and no
connection, and after `hibernate_after_s` (default 30 s) it leaves memory altogether. The
worker is a real `ledgerloop up` process with its default settings; its RSS and thread count
are read from /proc once every run waits (by then most, not all, have hibernated).
Target for 10,000 runs: <= 300 MB RSS, <= 50 threads.
BENCH_WAITING_RUNS sets the count (default 10,000).
"""

from __future__ import annotations

import time
from pathlib import Path

from ledgerloop.db.connect import connect
from ledgerloop.runs.start import start_run
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import start_worker, stop_worker, worker_env
from scripts.benchmarks.common import database, report, scripted
from scripts.benchmarks.results import Baseline, publish, size

N = int(size("BENCH_WAITING_RUNS", "10000", "5"))


def proc_status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            fields[key] = int(value.split()[0])
    return fields


def main() -> None:
    script = """
default:
  turns:
    - tool_use: {name: write_ticket, input: {title: "wait for me", priority: low}}
"""
    with database() as url, scripted(script) as model:
        env = worker_env(url, ANTHROPIC_BASE_URL=model.url)
        worker = start_worker(env, "--no-relay")
        try:
            with connect(url, autocommit=True) as conn:
                start = time.perf_counter()
                for lo in range(0, N, 500):
                    with conn.transaction():
                        for i in range(lo, min(N, lo + 500)):
                            start_run(conn, agent="ops", input={"message": f"run {i}"})
                parked_sql = (
                    "SELECT count(*) FILTER (WHERE status = 'awaiting_approval') AS waiting, "
                    "count(*) FILTER (WHERE status IN ('failed', 'cancelled')) AS lost "
                    "FROM ledgerloop.agent_run"
                )

                def parked() -> bool:
                    row = conn.execute(parked_sql).fetchone()
                    assert row is not None
                    return bool(row["waiting"] + row["lost"] >= N)

                wait_until(parked, timeout=3600, interval=1.0)
                counts = conn.execute(parked_sql).fetchone()
                assert counts is not None
                elapsed = time.perf_counter() - start
                time.sleep(2)  # let the worker settle before reading its footprint
                status = proc_status(worker.pid)
                hibernated = conn.execute(
                    "SELECT count(*) AS n FROM dbos.workflow_status WHERE status = 'DELAYED'"
                ).fetchone()
                assert hibernated is not None
        finally:
            stop_worker(worker)
    report(
        f"{N} runs waiting for approval on one worker",
        [
            ("resident memory (MB)", status["VmRSS"] / 1024, "target <= 300 MB"),
            ("threads", status["Threads"], "target <= 50"),
            ("time to park them all (s)", elapsed, f"{N / elapsed:.0f} runs/s"),
            ("runs that failed instead of waiting", counts["lost"], "expected 0"),
            ("of the waiting runs, hibernated", hibernated["n"], "out of memory until woken"),
        ],
    )
    baseline = Baseline("targets: <= 300 MB resident, <= 50 threads")
    publish(
        "waiting_runs",
        __doc__,
        baseline,
        command="BENCH_WAITING_RUNS=10000 scripts/bench waiting_runs",
    )


if __name__ == "__main__":
    main()
