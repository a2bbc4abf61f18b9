"""Continuous retention inside `ledgerloop up` (LEDGERLOOP_PURGE_JOURNALS_AFTER and
LEDGERLOOP_PURGE_RUNS_AFTER): every `purge_interval_s`, one worker of the fleet purges."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from ledgerloop.db.connect import connect
from ledgerloop.db.pooling import session_url
from ledgerloop.db.sql import load_queries
from ledgerloop.retention.purge import PurgeClient, PurgeOptions, PurgeReport, purge_finished
from ledgerloop.runtime import Runtime

log = logging.getLogger(__name__)
Q = load_queries("ledgerloop.retention")


def purge_once(runtime: Runtime, stop: asyncio.Event | None = None) -> PurgeReport | None:
    """One pass of both retention settings; None when another worker holds the purge lock.

    The lock is a session lock, held on the direct connection behind a transaction-mode
    pooler. With no direct URL there is no lock: every worker purges, which is safe (a
    purge may run twice at once, docs/operations.md) and only does some work twice."""
    settings = runtime.settings
    now = datetime.now(UTC)
    should_stop = (lambda: stop.is_set()) if stop is not None else (lambda: False)
    lock_url = session_url(runtime.database_url)
    with connect(lock_url or runtime.database_url, autocommit=True) as conn:
        if lock_url is not None:
            row = conn.execute(Q["purge_lock_try"]).fetchone()
            if row is None or not row["locked"]:
                return None
        client = PurgeClient(runtime.database_url)
        try:
            report = PurgeReport()
            if settings.purge_runs_after is not None:
                report.merge(
                    purge_finished(
                        conn, client.dbos, now - settings.purge_runs_after, should_stop=should_stop
                    )
                )
            if settings.purge_journals_after is not None:
                report.merge(
                    purge_finished(
                        conn,
                        client.dbos,
                        now - settings.purge_journals_after,
                        PurgeOptions(keep_audit=True),
                        should_stop=should_stop,
                    )
                )
            return report
        finally:
            client.close()
            if lock_url is not None:
                conn.execute(Q["purge_lock_release"])


async def purge_service(runtime: Runtime, stop: asyncio.Event) -> None:
    interval = runtime.settings.purge_interval_s
    while not stop.is_set():
        try:
            report = await asyncio.to_thread(purge_once, runtime, stop)
            if report is not None and report.runs:
                log.info("retention purged %d finished runs: %s", report.runs, report.to_json())
        except Exception:
            # Retention is housekeeping: a failed pass is retried at the next interval and
            # never stops the worker.
            log.exception("retention pass failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
