"""SQL start_run: from the caller's COMMIT to the run's first step starting on a worker.

The worker's dispatcher is woken by the NOTIFY the run's commit sends (DBOS's own queue
poll defaults to 1 s). Target: p50 <= 5 ms. The first step's start time comes
from DBOS's journal (operation_outputs.started_at_epoch_ms), on the same clock as the commit.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ledgerloop.db.connect import connect
from ledgerloop.runs.start import start_run
from ledgerloop.runtime import Runtime
from ledgerloop.testing.postgres import wait_until
from scripts.benchmarks.common import database, report, run_in_worker, scripted, settings_for

N = 40


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

            row = await asyncio.to_thread(wait_until, first_step, 30, 0.002)
            latencies.append(row["started_at_epoch_ms"] - committed_ms)
            await asyncio.sleep(0.05)  # let the run finish; start the next from idle
    return {"p50": statistics.median(latencies), "max": max(latencies)}


def main() -> None:
    with database() as url, scripted("default: {turns: [{text: done}]}") as model:
        settings = settings_for(url, model.url)
        result = run_in_worker(settings, url, measure)
    report(
        f"SQL start_run commit -> first step ({N} runs, woken by NOTIFY)",
        [
            ("p50 (ms)", result["p50"], "target <= 5 ms (DBOS default poll: ~1,000 ms)"),
            ("max (ms)", result["max"], ""),
        ],
    )


if __name__ == "__main__":
    main()
