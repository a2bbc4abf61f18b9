"""Dispatch: how a burst spreads over idle workers, and how soon an idle worker starts a run.

1. Three real `ledgerloop up --no-http --no-relay` workers, idle; one transaction starts 300
   runs with `ledgerloop.start_run` (BENCH_DISPATCH_RUNS). Each run's worker is read from
   DBOS's workflow row (nothing fails here, so each run runs on the worker that claimed
   it). Target: no worker gets more than 40% of them.
2. One idle worker; 40 runs started one at a time from SQL, each committed 50 ms after the
   previous run's first step; from the caller's COMMIT to the first step's start as DBOS
   journals it (same clock). Target: p50 <= 5 ms.
"""

from __future__ import annotations

import statistics
import time

import psycopg

from ledgerloop.db.connect import connect
from ledgerloop.runs.start import start_run
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import start_worker, stop_worker
from scripts.benchmarks.common import report, scripted
from scripts.benchmarks.fleet import counted_database, executors, fleet_env
from scripts.benchmarks.results import Baseline, publish, size

RUNS = int(size("BENCH_DISPATCH_RUNS", "300", "6"))
LATENCY_RUNS = int(size("BENCH_DISPATCH_LATENCY_RUNS", "40", "3"))


def first_executors(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT executor_id, count(*) FROM dbos.workflow_status "
            "WHERE name = 'ledgerloop_run' AND status <> 'ENQUEUED' GROUP BY executor_id"
        ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def finished(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM ledgerloop.agent_run WHERE status = 'succeeded'"
        ).fetchone()
    return int(row[0]) if row else 0


def spread(url: str, model_url: str) -> tuple[dict[str, int], float]:
    env = fleet_env(url, ANTHROPIC_BASE_URL=model_url)
    workers = [start_worker(env, "--no-relay") for _ in range(3)]
    try:
        wait_until(lambda: len(executors(url)) == 3, timeout=120, interval=0.2)
        time.sleep(3)  # idle: every worker waiting for work
        started = time.monotonic()
        with connect(url, autocommit=True) as conn, conn.transaction():
            for i in range(RUNS):
                start_run(conn, agent="ops", input={"message": f"burst {i}"})
        wait_until(lambda: finished(url) >= RUNS, timeout=600, interval=0.1)
        elapsed = time.monotonic() - started
        return first_executors(url), elapsed
    finally:
        for worker in workers:
            stop_worker(worker)


def latency(url: str, model_url: str) -> tuple[list[float], list[float]]:
    env = fleet_env(url, ANTHROPIC_BASE_URL=model_url)
    worker = start_worker(env, "--no-relay")
    samples: list[float] = []
    claims: list[float] = []
    try:
        wait_until(lambda: len(executors(url)) == 1, timeout=120, interval=0.2)
        time.sleep(3)
        with connect(url) as conn:
            for i in range(LATENCY_RUNS):
                with conn.transaction():
                    run_id = start_run(conn, agent="ops", input={"message": f"one {i}"})
                committed_ms = time.time() * 1000

                def first_step() -> object:
                    row = conn.execute(
                        "SELECT o.started_at_epoch_ms, w.started_at_epoch_ms AS claimed_ms "
                        "FROM dbos.operation_outputs o JOIN dbos.workflow_status w "
                        "ON w.workflow_uuid = o.workflow_uuid "
                        "WHERE o.workflow_uuid = %s AND o.function_id = 1",
                        (str(run_id),),  # noqa: B023
                    ).fetchone()
                    conn.commit()
                    return row

                row = wait_until(first_step, timeout=30, interval=0.002)
                samples.append(row["started_at_epoch_ms"] - committed_ms)  # type: ignore[index]
                claims.append(row["claimed_ms"] - committed_ms)  # type: ignore[index]
                time.sleep(0.05)
    finally:
        stop_worker(worker)
    return samples, claims


def main() -> None:
    with scripted("default: {turns: [{text: done}]}") as model:
        with counted_database() as url:
            counts, elapsed = spread(url, model.url)
        with counted_database() as url:
            samples, claims = latency(url, model.url)
    shares = sorted((n / RUNS for n in counts.values()), reverse=True)
    while len(shares) < 3:
        shares.append(0.0)
    report(
        f"burst of {RUNS} runs on 3 idle workers",
        [
            ("largest share (%)", shares[0] * 100, "target <= 40%"),
            ("second share (%)", shares[1] * 100, ""),
            ("smallest share (%)", shares[2] * 100, ""),
            ("start -> all runs succeeded (s)", elapsed, "the burst's throughput"),
        ],
    )
    report(
        f"SQL start_run commit -> first step, idle worker ({LATENCY_RUNS} runs)",
        [
            ("p50 (ms)", statistics.median(samples), "target <= 5 ms"),
            ("of which commit -> claim, p50 (ms)", statistics.median(claims), "NOTIFY, wake-up"),
            ("p95 (ms)", statistics.quantiles(samples, n=20)[18], ""),
            ("max (ms)", max(samples), ""),
        ],
    )
    publish("dispatch", __doc__, Baseline("targets: largest share <= 40%, first step p50 <= 5 ms"))


if __name__ == "__main__":
    main()
