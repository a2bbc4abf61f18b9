"""Fleet-wide model limits: three worker processes, a model server that answers 429 past its
requests-per-minute limit, and the same limit set as LEDGERLOOP_MODEL_RPM.

Scaled from the issue's 300 runs at 120 requests a minute (2.5 minutes of calls) to RUNS
runs at LIMIT a minute (the same shape, five times faster): one model call a run. Reports
the rate achieved over the calls (first to last), as a share of the limit, the 429s the
server answered, and the runs that did not succeed.
"""

from __future__ import annotations

import time
from pathlib import Path
from tempfile import TemporaryDirectory

import psycopg

from ledgerloop.models.script import parse_script
from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import start_worker, stop_all
from scripts.benchmarks import results
from scripts.benchmarks.common import database, report
from scripts.benchmarks.fleet import executors, fleet_env

RUNS = int(results.size("BENCH_MODEL_LIMITS_RUNS", "200", "6"))
LIMIT = 600
WORKERS = 3


def main() -> None:
    script = parse_script("default:\n  turns:\n    - {text: done}\n")
    with (
        database() as url,
        ScriptedModelServer(script, rpm_limit=LIMIT) as model,
        TemporaryDirectory() as tmp,
    ):
        env = fleet_env(
            url,
            ANTHROPIC_BASE_URL=model.url,
            LEDGERLOOP_MODEL_RPM=str(LIMIT),
        )
        logs = [Path(tmp) / f"w{i}.log" for i in range(WORKERS)]
        procs = [start_worker(env, log=log) for log in logs]
        try:
            wait_until(lambda: len(executors(url)) == WORKERS, timeout=120)
            with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
                for i in range(RUNS):
                    conn.execute(
                        "SELECT ledgerloop.start_run('ops', %s::jsonb)",
                        (f'{{"message": "limits {i}"}}',),
                    )
            started = time.monotonic()

            def ended() -> bool:
                with psycopg.connect(url, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM ledgerloop.agent_run "
                        "WHERE status IN ('succeeded', 'failed', 'cancelled')"
                    ).fetchone()
                return row is not None and row[0] == RUNS

            wait_until(ended, timeout=RUNS * 60 / LIMIT * 3 + 60)
            wall = time.monotonic() - started
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status <> 'succeeded') FROM ledgerloop.agent_run"
                ).fetchone()
            not_succeeded = int(row[0]) if row else -1
        finally:
            stop_all(*procs)
        answered = [r for r in model.requests() if r["status"] == 200]
        refused = [r for r in model.requests() if r["status"] == 429]
        span = max(r["at"] for r in answered) - min(r["at"] for r in answered)
        # N calls over a span hold N - 1 intervals; the first second's burst is in them.
        achieved = (len(answered) - 1) / span * 60 if span > 0 else float("inf")
        report(
            f"model limits: {WORKERS} workers, {RUNS} runs, server and "
            f"LEDGERLOOP_MODEL_RPM at {LIMIT}/min (the issue's 300 runs at 120/min, scaled)",
            [
                ("requests per minute achieved", achieved, f"limit {LIMIT}"),
                ("achieved / limit", achieved / LIMIT, "target >= 0.9"),
                ("429s answered by the server", float(len(refused)), "target: a handful"),
                ("runs not succeeded", float(not_succeeded), "target 0"),
                ("wall time for all runs (s)", wall, f"{RUNS} calls at {LIMIT}/min"),
            ],
        )
        results.publish(
            "model_limits", __doc__, results.Baseline("the limit", float(LIMIT), "requests/min")
        )


if __name__ == "__main__":
    main()
