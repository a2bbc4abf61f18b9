"""A worker stopped with SIGTERM while runs are in flight: it lets the step bodies under way
finish, starts no other, ends its executions between steps and hands the runs back, quietly
(no traceback, no log line carrying a step's arguments); another worker finishes them
without calling the model again for a step already recorded."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.db.connect import Conn
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import start_worker, stop_worker, worker_env
from tests.conftest import start_test_run

pytestmark = [pytest.mark.crash, pytest.mark.timeout(300)]

RUNS = 20
SCRIPT = """
default:
  turns:
    - {tool_use: {name: search_kb, input: {query: disk}}, delay_ms: 600}
    - {tool_use: {name: search_kb, input: {query: wal}}, delay_ms: 600}
    - {text: done, delay_ms: 600}
"""


def turns_by_run(requests: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}
    for request in requests:
        first = request["request"]["messages"][0]["content"]
        key = (first, int(request["turn"]))
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_sigterm_drains_between_steps_without_tracebacks(
    conn: Conn, db_url: str, scripted_model: Any, tmp_path: Path
) -> None:
    model = scripted_model(SCRIPT)
    env = worker_env(db_url, ANTHROPIC_BASE_URL=model.url)
    log = tmp_path / "first.log"
    first = start_worker(env, "--no-relay", log=log)
    try:
        wait_until(lambda: conn.execute("SELECT 1 FROM ledgerloop.executor").fetchone(), timeout=60)
        for i in range(RUNS):
            start_test_run(conn, "ops", f"drain {i}")
        wait_until(lambda: len(model.requests()) >= RUNS, timeout=60)
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0
    finally:
        stop_worker(first)
    text = log.read_text()
    assert "Traceback" not in text, text
    assert "drain 1" not in text, text  # no step arguments (conversation text) in the log
    assert "went back on the queue" in text, text
    # Nothing is left to a worker that is gone: every run finished or is queued again.
    rows = conn.execute(
        "SELECT status, count(*) AS n FROM dbos.workflow_status GROUP BY status"
    ).fetchall()
    assert {r["status"] for r in rows} <= {"ENQUEUED", "SUCCESS"}, rows
    assert conn.execute("SELECT count(*) AS n FROM ledgerloop.executor").fetchone() == {"n": 0}

    second_log = tmp_path / "second.log"
    with_second = start_worker(env, "--no-relay", log=second_log)
    try:
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) AS n FROM ledgerloop.agent_run WHERE status = 'succeeded'"
                ).fetchone()
                == {"n": RUNS}
            ),
            timeout=180,
        )
    except BaseException:
        # What the second worker and the unfinished runs say, for whoever reads the failure.
        unfinished = conn.execute(
            "SELECT r.id, r.status, w.status AS workflow, w.executor_id "
            "FROM ledgerloop.agent_run r JOIN dbos.workflow_status w "
            "ON w.workflow_uuid = r.id::text WHERE r.status <> 'succeeded'"
        ).fetchall()
        print(unfinished, second_log.read_text()[-4000:])
        raise
    finally:
        stop_worker(with_second)
    # The model calls under way at the stop finished and were recorded; no turn was paid twice.
    counts = turns_by_run(model.requests())
    assert len(counts) == RUNS * 3
    assert [key for key, n in counts.items() if n > 1] == []
