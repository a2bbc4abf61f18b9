"""Restart after kill -9 with N runs in flight: how fast a fresh worker resumes them.

A real `ledgerloop up` process takes N runs (default 1,000) that all sit in their first model
call (the scripted model holds it for ten minutes), and is killed with SIGKILL. A fresh worker
then claims the dead executor, DBOS re-enqueues its runs, and each run replays its journal and
calls the model again (answered at once, so the run then finishes). "Resumed" is that second
call reaching the model: the run is executing its first unfinished step again. The rate is
taken between the first and the last resumed run (the fresh process's start-up is reported on
its own). Target: >= 300 runs/s. BENCH_RESTART_RUNS sets N.
"""

from __future__ import annotations

import os
import signal
import time

from ledgerloop.db.connect import connect
from ledgerloop.runs.start import start_run
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import start_worker, stop_worker, worker_env
from scripts.benchmarks.common import database, report, scripted

N = int(os.environ.get("BENCH_RESTART_RUNS", "1000"))


def main() -> None:
    # Each run's first model call hangs until the worker is killed; the call its resumed run
    # makes (a second attempt at the same turn) is answered at once, and the run finishes.
    script = "default: {turns: [{status: 529, times: 1, delay_ms: 600000, then: {text: done}}]}"
    with database() as url, scripted(script) as model:
        env = worker_env(url, ANTHROPIC_BASE_URL=model.url)

        def calls() -> int:
            return sum(1 for r in model.requests() if r["turn"] == 0)

        first = start_worker(env, "--no-relay")
        try:
            with connect(url, autocommit=True) as conn, conn.transaction():
                for i in range(N):
                    start_run(conn, agent="ops", input={"message": f"run {i}"})
            wait_until(lambda: calls() >= N, timeout=600, interval=0.2)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        killed = time.time()
        second = start_worker(env, "--no-relay")
        try:
            wait_until(lambda: calls() >= 2 * N, timeout=600, interval=0.05)
        finally:
            stop_worker(second)
        calls_at = sorted(r["at"] for r in model.requests() if r["turn"] == 0)
    started, resumed = calls_at[:N], calls_at[N:]
    # Baseline from the same run: the first worker starting the same runs fresh.
    fresh = (N - 1) / (started[-1] - started[0])
    window = resumed[-1] - resumed[0]
    rate = (N - 1) / window if window else float("inf")
    report(
        f"restart after kill -9 with {N} runs in flight",
        [
            ("kill -> first run resumed (s)", resumed[0] - killed, "fresh process start-up"),
            ("first -> last run resumed (s)", window, ""),
            ("fresh start, first model call (runs/s)", fresh, "baseline"),
            ("resumed (runs/s)", rate, f"{rate / fresh:.2f}x the fresh rate (target >= 300/s)"),
            ("kill -> all resumed (s)", resumed[-1] - killed, ""),
        ],
    )


if __name__ == "__main__":
    main()
