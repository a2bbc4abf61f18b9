"""Dispatch: a worker wakes on the NOTIFY a run's commit sends, claims in small batches, and
does not rely on polling (here the fallback poll is five minutes away)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ledgerloop.db.connect import Conn
from ledgerloop.fleet.dispatch import Dispatcher
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.worker import WorkerThread
from tests.conftest import start_test_run

RUNS = 24


def succeeded(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM ledgerloop.agent_run WHERE status = 'succeeded'"
    ).fetchone()
    return int(row["n"]) if row else 0


def _idle_worker(
    db_url: str, make_settings: Callable[..., Any], scripted_model: Any, **settings: Any
) -> WorkerThread:
    """A worker of the test agents whose runs answer at once; `with` runs it."""
    model = scripted_model("default: {turns: [{text: done}]}")
    overrides = {"anthropic_base_url": model.url, "agent_modules": "tests.support.agents"}
    return WorkerThread(make_settings(**overrides, **settings), db_url)


def _dispatcher(worker: WorkerThread) -> Dispatcher:
    assert worker.runtime is not None
    dispatcher = worker.runtime.dispatcher
    assert isinstance(dispatcher, Dispatcher)
    return dispatcher


def test_runs_started_from_sql_are_dispatched_by_notify_in_batches(
    conn: Conn, db_url: str, make_settings: Callable[..., Any], scripted_model: Any
) -> None:
    idle = _idle_worker(
        db_url, make_settings, scripted_model, dispatch_fallback_s=300, dispatch_batch=5
    )
    with idle as worker:
        # One at a time, each in its own transaction, then a burst in one transaction.
        for i in range(4):
            start_test_run(conn, "ops", f"one {i}")
            wait_until(lambda i=i: succeeded(conn) == i + 1, timeout=30)  # type: ignore[misc]
        with conn.transaction():
            for i in range(RUNS):
                start_test_run(conn, "ops", f"burst {i}")
        wait_until(lambda: succeeded(conn) == RUNS + 4, timeout=60)
        dispatcher = _dispatcher(worker)
    # The dispatcher claimed every run, and no claim took more than a batch, so the burst was
    # left for other workers to share.
    assert dispatcher.claimed == RUNS + 4
    assert 1 <= dispatcher.largest_claim <= 5


def test_an_idle_dispatcher_sleeps_until_the_fallback_yet_stops_at_once(
    db_url: str, make_settings: Callable[..., Any], scripted_model: Any
) -> None:
    # It no longer wakes every half second to look for a stop (most of an idle worker's CPU
    # after DBOS's own notifier): stop() wakes it on a channel of its own.
    with _idle_worker(db_url, make_settings, scripted_model, dispatch_fallback_s=300) as worker:
        dispatcher = _dispatcher(worker)
        time.sleep(1)  # into its wait for a notification
        began = time.monotonic()
        dispatcher.stop()
        assert time.monotonic() - began < 5  # its join gives up after 10 s


def test_a_lone_worker_claims_a_burst_without_pausing_for_peers(
    conn: Conn, db_url: str, make_settings: Callable[..., Any], scripted_model: Any
) -> None:
    # The pause after a full batch leaves the next one to a peer; alone, it only slowed a
    # burst (1,000 runs started at 25 runs/s). The heartbeat counts the live peers.
    with _idle_worker(db_url, make_settings, scripted_model, stale_after_s=30) as worker:
        dispatcher = _dispatcher(worker)
        wait_until(lambda: dispatcher.peers() == 0, timeout=10)
        assert dispatcher.pause_s() == 0
        # A peer that heartbeats (its row is fresh): batches are left for it again.
        conn.execute(
            "INSERT INTO ledgerloop.executor (id, application_version, hostname, pid, lock_key) "
            "VALUES ('peer-1', 'v', 'elsewhere', 1, 1)"
        )
        wait_until(lambda: dispatcher.peers() == 1, timeout=10)
        assert dispatcher.pause_s() > 0
        # Silent past the staleness limit, it no longer counts (before anyone judges it).
        conn.execute(
            "UPDATE ledgerloop.executor SET heartbeat_at = now() - interval '31 seconds' "
            "WHERE id = 'peer-1'"
        )
        wait_until(lambda: dispatcher.peers() == 0, timeout=10)
        assert dispatcher.pause_s() == 0
        conn.execute("DELETE FROM ledgerloop.executor WHERE id = 'peer-1'")
