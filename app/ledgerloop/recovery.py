"""Executor heartbeats, and recovery of the runs a dead worker left pending.

Every worker process has its own DBOS executor id. DBOS recovers only its own executor's
pending workflows at launch, so a restarted worker (a new id) would never resume the runs of
the one that died. Each worker heartbeats into ledgerloop.executor; a survivor deletes a dead
executor's row (one DELETE ... RETURNING, so exactly one survivor claims it) and asks DBOS to
re-enqueue that executor's pending workflows. A row from this host whose pid is gone is dead
at once; any other row is dead after STALE_AFTER_S without a heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

from ledgerloop.db.connect import Conn

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
STALE_AFTER_S = 5.0


def executor_register(conn: Conn, executor_id: str, app_version: str) -> None:
    conn.execute(
        """
        INSERT INTO ledgerloop.executor (id, application_version, hostname, pid)
        VALUES (%s, %s, %s, %s)
        ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
        """,
        (executor_id, app_version, socket.gethostname(), os.getpid()),
    )


def executor_heartbeat(conn: Conn, executor_id: str) -> None:
    conn.execute(
        "UPDATE ledgerloop.executor SET heartbeat_at = now() WHERE id = %s", (executor_id,)
    )


def executor_unregister(conn: Conn, executor_id: str) -> None:
    """A clean stop: hand the runs this worker was executing back to the queue, then leave.

    DBOS's shutdown cancels them and leaves them PENDING under this executor, and once the row
    is gone no survivor would claim them. Call it after DBOS is destroyed (nothing of ours
    runs any more); a run moved back to ENQUEUED goes to whichever worker dequeues it next,
    and replays its journal there. Both in one transaction: a stop that dies halfway leaves
    the row, and a survivor recovers the runs as it would after a crash.
    """
    with conn.transaction():
        conn.execute(
            """
            UPDATE dbos.workflow_status
            SET status = 'ENQUEUED',
                owner_xid = NULL,
                started_at_epoch_ms = NULL,
                queue_name = coalesce(queue_name, '_dbos_internal_queue'),
                updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
            WHERE executor_id = %s AND status = 'PENDING'
            """,
            (executor_id,),
        )
        conn.execute("DELETE FROM ledgerloop.executor WHERE id = %s", (executor_id,))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def executors_claim_dead(conn: Conn, me: str, app_version: str) -> list[str]:
    """Delete and return the executors that are dead; only the deleter recovers them."""
    host = socket.gethostname()
    rows = conn.execute(
        """
        SELECT id, hostname, pid, heartbeat_at < now() - make_interval(secs => %s) AS stale
        FROM ledgerloop.executor
        WHERE id <> %s AND application_version = %s
        """,
        (STALE_AFTER_S, me, app_version),
    ).fetchall()
    dead = [
        r["id"] for r in rows if r["stale"] or (r["hostname"] == host and not _pid_alive(r["pid"]))
    ]
    if not dead:
        return []
    claimed = conn.execute(
        "DELETE FROM ledgerloop.executor WHERE id = ANY(%s) RETURNING id", (dead,)
    ).fetchall()
    return [r["id"] for r in claimed]


async def heartbeat_and_recover(
    pool: Any, executor_id: str, app_version: str, stop: asyncio.Event
) -> None:
    """Heartbeat every second; recover dead executors' runs as soon as they are seen."""
    from dbos import DBOS

    def tick() -> list[str]:
        with pool.connection() as conn:
            executor_heartbeat(conn, executor_id)
            return executors_claim_dead(conn, executor_id, app_version)

    while not stop.is_set():
        try:
            dead = await asyncio.to_thread(tick)
            if dead:
                # DBOS's own recovery routine, scoped to the executors we claimed; it
                # re-enqueues, so a workflow another process already resumed runs once.
                handles = await asyncio.to_thread(DBOS._recover_pending_workflows, dead)
                log.info("recovered %d runs from dead executors %s", len(handles), dead)
        except Exception:
            log.exception("heartbeat/recovery tick failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEARTBEAT_S)
