"""Restart after kill -9 with N runs in flight: how fast a fresh worker resumes them.

A real `ledgerloop up` process takes N runs (default 1,000) that all sit in their first model
call (the scripted model holds it for ten minutes), and is killed with SIGKILL. A fresh worker
then claims the dead executor, DBOS re-enqueues its runs, and each run replays its journal and
calls the model again (answered at once, so the run then finishes). "Resumed" is that second
call reaching the model: the run is executing its first unfinished step again. The rate is
taken between the first and the last resumed run (the fresh process's start-up is reported on
its own). Target: >= 300 runs/s, and at least bare DBOS's recovery rate: the same N runs as
bare DBOS workflows (one step making the same model call through the same SDK), killed the
same way and recovered by a new process under the same executor id, in the same run.
BENCH_RESTART_RUNS sets N.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ledgerloop.db.connect import connect
from ledgerloop.models.scripted_server import ScriptedModelServer
from ledgerloop.runs.start import start_run
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import start_worker, stop_worker, worker_env
from scripts.benchmarks.common import REPO, database, report, scripted
from scripts.benchmarks.results import Baseline, publish, size

N = int(size("BENCH_RESTART_RUNS", "1000", "5"))
# Each run's first model call hangs until the worker is killed; the call its resumed run makes
# (a second attempt at the same turn) is answered at once, and the run finishes.
SCRIPT = "default: {turns: [{status: 529, times: 1, delay_ms: 600000, then: {text: done}}]}"


def _resumed(model: ScriptedModelServer, killed: float) -> tuple[float, float, float]:
    """(fresh start rate, resumed rate, kill -> first resumed) from the model's requests."""
    calls_at = sorted(r["at"] for r in model.requests() if r["turn"] == 0)
    started, resumed = calls_at[:N], calls_at[N:]
    fresh = (N - 1) / (started[-1] - started[0])
    window = resumed[-1] - resumed[0]
    rate = (N - 1) / window if window else float("inf")
    return fresh, rate, resumed[0] - killed


def _calls(model: ScriptedModelServer) -> int:
    return sum(1 for r in model.requests() if r["turn"] == 0)


def _ledgerloop(url: str) -> tuple[float, float, float]:
    with scripted(SCRIPT) as model:
        env = worker_env(url, ANTHROPIC_BASE_URL=model.url)
        first = start_worker(env, "--no-relay")
        try:
            with connect(url, autocommit=True) as conn, conn.transaction():
                for i in range(N):
                    start_run(conn, agent="ops", input={"message": f"run {i}"})
            wait_until(lambda: _calls(model) >= N, timeout=600, interval=0.2)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        killed = time.time()
        second = start_worker(env, "--no-relay")
        try:
            wait_until(lambda: _calls(model) >= 2 * N, timeout=600, interval=0.05)
        finally:
            stop_worker(second)
        return _resumed(model, killed)


def _bare(url: str) -> tuple[float, float, float]:
    """The same on bare DBOS (scripts/benchmarks/restart_bare.py): a process starts N
    workflows, each in its model call, and is killed; a new process with the same executor
    id recovers them at launch."""
    with scripted(SCRIPT) as model:
        env = {**os.environ, "PYTHONPATH": str(REPO / "app") + os.pathsep + str(REPO)}
        cmd = [sys.executable, "-m", "scripts.benchmarks.restart_bare"]
        first = subprocess.Popen(
            [*cmd, "start", url, model.url, str(N)], env=env, cwd=REPO, stdout=subprocess.DEVNULL
        )
        try:
            wait_until(lambda: _calls(model) >= N, timeout=600, interval=0.2)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        killed = time.time()
        second = subprocess.Popen(
            [*cmd, "recover", url, model.url], env=env, cwd=REPO, stdout=subprocess.DEVNULL
        )
        try:
            wait_until(lambda: _calls(model) >= 2 * N, timeout=600, interval=0.05)
        finally:
            second.terminate()
            second.wait(timeout=30)
        return _resumed(model, killed)


def main() -> None:
    with database() as url:
        ll_fresh, ll_rate, ll_first = _ledgerloop(url)
        bare_fresh, bare_rate, bare_first = _bare(url)
    report(
        f"restart after kill -9 with {N} runs in flight (Ledgerloop, then bare DBOS, same run)",
        [
            ("Ledgerloop: kill -> first run resumed (s)", ll_first, "takeover + start-up"),
            ("Ledgerloop: fresh start, first model call (runs/s)", ll_fresh, ""),
            ("Ledgerloop: resumed (runs/s)", ll_rate, f"{ll_rate / bare_rate:.2f}x bare DBOS"),
            ("bare DBOS: kill -> first workflow resumed (s)", bare_first, "start-up"),
            ("bare DBOS: fresh start, first model call (runs/s)", bare_fresh, ""),
            ("bare DBOS: recovered (runs/s)", bare_rate, "baseline (target: >= 1.0x)"),
        ],
    )
    baseline = Baseline("bare DBOS recovering the same runs, same run", bare_rate, "runs/s")
    publish("restart", __doc__, baseline, command="BENCH_RESTART_RUNS=1000 scripts/bench restart")


if __name__ == "__main__":
    main()
