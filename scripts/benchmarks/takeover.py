"""Takeover: kill -9 one of three workers with 300 runs in flight.

Three real `ledgerloop up --no-http --no-relay` workers, each in a UTS namespace with a host
name of its own (as on three machines), share 300 runs (BENCH_TAKEOVER_RUNS) of the ops
agent: six turns that each call the read tool `search_kb`, every model call held 300 ms by
the scripted model. Once every run is under way, the worker holding the most runs is killed
with SIGKILL. For each of its runs, "resumed" is its first model call after the kill (the run
is executing a step again, on a survivor); "finished" is the run reaching `succeeded`.

Reported: kill -> first resumed step (p50, p95; target p95 <= 3 s), kill -> all its runs
finished, and the invariants: model calls made for a step after that step was recorded
(target 0), survivors taken over (target 0), runs not succeeded.
"""

from __future__ import annotations

import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from ledgerloop.db.connect import connect
from ledgerloop.runs.start import start_run
from ledgerloop.testing.postgres import wait_until
from scripts.benchmarks.common import report, scripted
from scripts.benchmarks.fleet import counted_database, executors, fleet_env, spawn_worker
from scripts.benchmarks.results import Baseline, publish, size

RUNS = int(size("BENCH_TAKEOVER_RUNS", "300", "6"))
#: The workers' default (LEDGERLOOP_STALE_AFTER_S).
STALE_AFTER_S = 5.0
TURNS = 6
SCRIPT = (
    "default: {turns: ["
    + ", ".join(
        ["{tool_use: {name: search_kb, input: {query: disk}}, delay_ms: 300}"] * (TURNS - 1)
    )
    + ", {text: done, delay_ms: 300}]}"
)


def pending_by_worker(url: str) -> dict[str, list[str]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT executor_id, workflow_uuid FROM dbos.workflow_status "
            "WHERE name = 'ledgerloop_run' AND status = 'PENDING'"
        ).fetchall()
    found: dict[str, list[str]] = {}
    for executor_id, workflow_id in rows:
        found.setdefault(str(executor_id), []).append(str(workflow_id))
    return found


def succeeded(url: str, run_ids: list[str]) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM ledgerloop.agent_run WHERE id::text = ANY(%s) "
            "AND status = 'succeeded'",
            (run_ids,),
        ).fetchone()
    return int(row[0]) if row else 0


def repeated_recorded_steps(
    url: str, requests: list[dict[str, Any]], inputs: dict[str, str]
) -> int:
    """Model calls for a think step made after DBOS had recorded that step."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT workflow_uuid, function_name, completed_at_epoch_ms "
            "FROM dbos.operation_outputs WHERE function_name LIKE 'think-%%'"
        ).fetchall()
    recorded = {(str(w), str(name)): int(done) for w, name, done in rows if done is not None}
    repeats = 0
    for request in requests:
        run = inputs.get(first_text(request))
        done = recorded.get((run, f"think-{request['turn']}")) if run else None
        if done is not None and request["at"] * 1000 > done + 1:
            repeats += 1
    return repeats


def claimed_at(url: str, run_ids: list[str]) -> dict[str, float]:
    """When each run was last claimed by a worker (epoch seconds, the database's clock)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT workflow_uuid, started_at_epoch_ms FROM dbos.workflow_status "
            "WHERE workflow_uuid = ANY(%s)",
            (run_ids,),
        ).fetchall()
    return {str(w): int(ms) / 1000 for w, ms in rows if ms is not None}


def taken_by(url: str, run_ids: list[str]) -> list[int]:
    """How many of `run_ids` each worker finished, most first."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s) "
            "GROUP BY executor_id ORDER BY 1 DESC",
            (run_ids,),
        ).fetchall()
    return [int(r[0]) for r in rows]


def first_text(request: dict[str, Any]) -> str:
    for message in (request.get("request") or {}).get("messages", []):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def pct95(sorted_values: list[float]) -> float:
    return sorted_values[max(0, int(len(sorted_values) * 0.95) - 1)]


def main() -> None:
    logs = Path(tempfile.mkdtemp(prefix="ledgerloop-bench-takeover-"))
    with counted_database() as url, scripted(SCRIPT) as model:
        env = fleet_env(url, ANTHROPIC_BASE_URL=model.url)
        workers = [
            spawn_worker(env, f"host-{i}", logs / f"w{i}.log", "--no-relay") for i in range(3)
        ]
        try:
            wait_until(lambda: len(executors(url)) == 3, timeout=120, interval=0.2)
            # A worker judges its peers only once it has heartbeated for stale_after_s (after
            # a start, a freeze or an outage it first watches them come back): as in a fleet
            # that has been up for a while, the kill must not come before that.
            time.sleep(STALE_AFTER_S)
            live_before = set(executors(url))
            inputs: dict[str, str] = {}
            with connect(url, autocommit=True) as conn, conn.transaction():
                for i in range(RUNS):
                    text = f"run {i}"
                    inputs[text] = str(start_run(conn, agent="ops", input={"message": text}))
            wait_until(
                lambda: len({first_text(r) for r in model.requests()}) >= RUNS,
                timeout=300,
                interval=0.1,
            )
            by_worker = pending_by_worker(url)
            victim_id = max(by_worker, key=lambda k: len(by_worker[k]))
            lost = by_worker[victim_id]
            victim = next(w for w in workers if f"host-{workers.index(w)}" in victim_id)
            victim.send_signal(signal.SIGKILL)
            killed = time.time()
            victim.wait(30)
            wait_until(lambda: succeeded(url, lost) == len(lost), timeout=300, interval=0.1)
            finished = time.time() - killed
            wait_until(lambda: succeeded(url, list(inputs.values())) == RUNS, timeout=300)
            requests = model.requests()
            live_after = set(executors(url))
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(30)
                except Exception:
                    worker.kill()
        run_of = {v: k for k, v in inputs.items()}
        resumed = []
        for run_id in lost:
            text = run_of[run_id]
            after = [r["at"] for r in requests if first_text(r) == text and r["at"] > killed]
            if after:
                resumed.append(min(after) - killed)
        repeats = repeated_recorded_steps(url, requests, inputs)
        claims = claimed_at(url, lost)
        split = taken_by(url, lost)
    # Where the time goes: kill -> a survivor claims the run, then claim -> its first step.
    to_claim = sorted(claims[r] - killed for r in lost if r in claims)
    claim_to_step = []
    for run_id in lost:
        text = run_of[run_id]
        after = [r["at"] for r in requests if first_text(r) == text and r["at"] > killed]
        if after and run_id in claims:
            claim_to_step.append(min(after) - claims[run_id])
    claim_to_step.sort()
    survivors_taken = len((live_before - {victim_id}) - live_after)
    resumed.sort()
    p95 = pct95(resumed)
    report(
        f"kill -9 one of 3 workers, {RUNS} runs in flight ({len(lost)} on the killed one)",
        [
            ("kill -> first resumed step, p50 (s)", statistics.median(resumed), ""),
            (
                "kill -> first resumed step, p95 (s)",
                p95,
                "target <= 3 s",
            ),
            ("of which kill -> its first run claimed (s)", to_claim[0], "detection"),
            ("of which kill -> claimed by a survivor, p50 (s)", statistics.median(to_claim), ""),
            ("of which kill -> claimed by a survivor, p95 (s)", pct95(to_claim), ""),
            ("of which claimed -> first step, p95 (s)", pct95(claim_to_step), ""),
            ("kill -> all its runs finished (s)", finished, ""),
            ("its runs taken by the busiest survivor", float(split[0]), f"split {split}"),
            ("its runs resumed", float(len(resumed)), f"of {len(lost)}"),
            ("model calls for steps already recorded", float(repeats), "target 0"),
            ("live workers taken over", float(survivors_taken), "target 0"),
        ],
    )
    print(f"  worker logs: {logs}")
    publish("takeover", __doc__, Baseline("target: kill -> first resumed step p95 <= 3 s"))


if __name__ == "__main__":
    main()
