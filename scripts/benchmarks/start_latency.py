"""SQL start_run: from the caller's COMMIT to the run's first step starting on a worker.

The worker's dispatcher is woken by the NOTIFY the run's commit sends (DBOS's own queue
poll defaults to 1 s). Target: p50 <= 5 ms. The first step's start time comes
from DBOS's journal (operation_outputs.started_at_epoch_ms), on the same clock as the commit.

Then, with the worker stopped, the call itself: `SELECT ledgerloop.start_run(...)` on an
autocommit connection (its own transaction), against a baseline in the same run: the same
input INSERTed into a table of one jsonb column and committed, alternating in rounds.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from psycopg.types.json import Jsonb

from ledgerloop.db.connect import connect
from ledgerloop.runs.start import start_run
from ledgerloop.runtime import Runtime
from ledgerloop.testing.postgres import wait_until
from scripts.benchmarks.common import database, report, run_in_worker, scripted, settings_for
from scripts.benchmarks.results import Baseline, publish, size

N = int(size("BENCH_START_RUNS", "40", "3"))
CALLS = int(size("BENCH_START_CALLS", "200", "3"))
CALL_ROUNDS = int(size("BENCH_START_CALL_ROUNDS", "5", "1"))
CALL_INPUT = {"message": "hello", "context": {"ticket": {"title": "t", "tags": ["a", "b"]}}}


async def measure(runtime: Runtime) -> dict[str, Any]:
    import asyncio

    latencies = []
    with connect(runtime.database_url) as conn:
        for i in range(N):
            with conn.transaction():
                run_id = start_run(conn, agent="ops", input={"message": f"m{i}"})
            committed_ms = time.time() * 1000

            def first_step() -> Any:
                row = conn.execute(
                    "SELECT started_at_epoch_ms FROM dbos.operation_outputs "
                    "WHERE workflow_uuid = %s AND function_id = 1",
                    (str(run_id),),  # noqa: B023
                ).fetchone()
                conn.commit()
                return row

            row: Any = await asyncio.to_thread(wait_until, first_step, 30, 0.002)
            latencies.append(row["started_at_epoch_ms"] - committed_ms)
            await asyncio.sleep(0.05)  # let the run finish; start the next from idle
    return {"p50": statistics.median(latencies), "max": max(latencies)}


def measure_call(url: str) -> tuple[float, float]:
    """Median ms of a start_run call and of the raw INSERT + COMMIT (medians of rounds)."""
    statements = {
        "start_run": "SELECT ledgerloop.start_run('ops', %s)",
        "raw": "INSERT INTO bench_raw_input (input) VALUES (%s)",
    }
    medians: dict[str, list[float]] = {name: [] for name in statements}
    with connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_raw_input (input jsonb NOT NULL)")
        for _ in range(CALL_ROUNDS):
            for name, statement in statements.items():
                took = []
                for i in range(CALLS + 20):
                    start = time.perf_counter()
                    conn.execute(statement, (Jsonb(CALL_INPUT),))
                    if i >= 20:  # the first ones warm the plans up
                        took.append((time.perf_counter() - start) * 1000)
                medians[name].append(statistics.median(took))
    return statistics.median(medians["start_run"]), statistics.median(medians["raw"])


def main() -> None:
    with database() as url, scripted("default: {turns: [{text: done}]}") as model:
        settings = settings_for(url, model.url)
        result = run_in_worker(settings, url, measure)
        call_ms, raw_ms = measure_call(url)
    report(
        f"SQL start_run commit -> first step ({N} runs, woken by NOTIFY)",
        [
            ("p50 (ms)", result["p50"], "target <= 5 ms (DBOS default poll: ~1,000 ms)"),
            ("max (ms)", result["max"], ""),
        ],
    )
    report(
        f"SQL start_run, the call alone ({CALL_ROUNDS} rounds x {CALLS}, alternating)",
        [
            ("start_run call, autocommit (ms)", call_ms, f"{call_ms / raw_ms:.2f}x the raw"),
            ("raw INSERT of the input + COMMIT (ms)", raw_ms, "baseline"),
        ],
    )
    publish("start_latency", __doc__, Baseline("a raw INSERT of the input + COMMIT", raw_ms, "ms"))


if __name__ == "__main__":
    main()
