"""Three worker processes keep a schedule that ticks every second; one of them is killed
(SIGKILL) while it holds a tick: after its run was started and before the tick was marked
decided, in one transaction. Every tick of the window gets exactly one run: none is lost to
the kill, none is made twice by the survivors, and no run is enqueued twice."""

from __future__ import annotations

import signal
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import start_worker, stop_all, worker_env

pytestmark = pytest.mark.crash

#: Ticks to see made after the kill (a few seconds: the suite must stay fast).
AFTER_KILL = 3


def schedule_runs(conn: Conn) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT id, idempotency_key FROM ledgerloop.agent_run "
        "WHERE idempotency_key LIKE 'schedule:every-second:%' ORDER BY idempotency_key"
    ).fetchall()


def tick_of(key: str) -> datetime:
    return datetime.strptime(key.removeprefix("schedule:every-second:"), "%Y-%m-%dT%H:%M:%SZ")


def test_one_run_per_tick_with_a_worker_killed_holding_a_tick(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model("default:\n  turns:\n    - {text: done}\n")
    env = worker_env(
        db_url,
        ANTHROPIC_BASE_URL=model.url,
        LEDGERLOOP_AGENT_MODULES="ledgerloop.examples.ops_agent,tests.support.schedule_agents",
        LEDGERLOOP_DBOS_POOL_SIZE="4",
        LEDGERLOOP_POOL_SIZE="3",
    )
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    # w0 dies at the first tick it wins, inside the tick's transaction.
    armed = {**env, "LEDGERLOOP_FAULTS": "schedule.before_decided"}
    procs: list[subprocess.Popen[bytes]] = [
        start_worker(armed if i == 0 else env, log=logs[i]) for i in range(3)
    ]

    def output() -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())

    try:
        # Killed by its fault; if the others won every tick for 20 s, killed from here.
        try:
            wait_until(lambda: procs[0].poll() is not None, timeout=40)
        except AssertionError:
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait()
        assert procs[0].returncode == -signal.SIGKILL, output()
        killed_at = len(schedule_runs(conn))
        wait_until(lambda: len(schedule_runs(conn)) >= killed_at + AFTER_KILL, timeout=30)
    finally:
        stop_all(*procs)

    runs = schedule_runs(conn)
    ticks = sorted(tick_of(r["idempotency_key"]) for r in runs)
    expected = [ticks[0] + timedelta(seconds=i) for i in range(len(ticks))]
    assert ticks == expected, f"ticks with no run or two: {sorted(set(expected) ^ set(ticks))}"
    workflows = conn.execute(
        "SELECT count(*) AS n FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s)",
        ([str(r["id"]) for r in runs],),
    ).fetchone()
    assert workflows == {"n": len(runs)}, output()
