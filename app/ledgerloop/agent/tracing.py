"""The loop's side of one trace per run (ledgerloop.telemetry.runtrace has the spans).

A run's first execution does no tracing I/O at all: its identity is journaled by the
`memory-load` step it runs anyway. A resumed execution (after a crash, a stop or a
hibernation; never on the hot path) records itself on the run and reads where the journal
ended, to tell replayed operations from real ones and to rebuild a killed predecessor's span.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from ledgerloop.agent import dbos_waiters
from ledgerloop.db.sql import load_queries
from ledgerloop.runs.store import run_execution_end, run_execution_swap
from ledgerloop.runtime import get_runtime
from ledgerloop.telemetry.executions import (
    Execution,
    current_execution,
    end_hibernating_execution,
    flush,
    predecessor_from,
    replayed,
    wait_span,
)
from ledgerloop.telemetry.runtrace import recording

Q = load_queries("ledgerloop.agent", "tracing.sql")


async def resume(execution: Execution, first: dict[str, Any]) -> None:
    """This execution resumes a run: take it over (one transaction) when spans are recorded."""
    execution.resumed = True
    if not recording() or not dbos_waiters.in_workflow():
        return  # nothing goes anywhere, or a replay harness runs the workflow: no I/O

    def takeover() -> tuple[dict[str, Any] | None, int, int | None]:
        with get_runtime().pool.connection() as conn, conn.transaction():
            journal = conn.execute(Q["journal_end"], {"workflow_id": execution.run_id}).fetchone()
            previous = run_execution_swap(conn, uuid.UUID(execution.run_id), execution.record())
        assert journal is not None
        return previous, int(journal["journal_end"]), journal["last_checkpoint_ms"]

    previous, journal_end, last_ms = await asyncio.to_thread(takeover)
    execution.journal_end = journal_end
    execution.predecessor = predecessor_from(first, previous, journal_end, last_ms)


async def end_hibernating() -> tuple[str, dict[str, Any]] | None:
    """End and export this execution's span before its run is parked; returns what the park
    records (that this execution ended its own span), or None when spans go nowhere."""
    if not recording():
        return None
    execution = end_hibernating_execution()
    if execution is None:
        return None
    await asyncio.to_thread(flush)
    return execution.run_id, {**execution.record(), "end": "hibernated"}


def record_hibernated(conn: Any, record: tuple[str, dict[str, Any]] | None) -> None:
    """Inside the park's transaction."""
    if record is not None:
        run_execution_end(conn, uuid.UUID(record[0]), record[1])


def count_call(kind: str, n: int = 1) -> None:
    """A journaled model or tool call of the run (workflow code: replays count too); `n`
    -1 takes back one counted for a step that turned out to make none."""
    execution = current_execution()
    if execution is None:
        return
    if kind == "inference":
        execution.inference_calls += n
    else:
        execution.tool_calls += n


def wait_replayed() -> bool:
    """Right after a durable wait returned (workflow code): whether the journal answered it.
    For a caller that learns what the wait meant (a record read by a step) only later."""
    return replayed(dbos_waiters.last_recv_id())


def step_replayed() -> bool:
    """Right after a step returned (workflow code): whether the journal answered it."""
    return replayed(dbos_waiters.last_step_id())


def waited(
    kind: str,
    tool_name: str,
    started_at: float | None,
    *,
    was_replayed: bool | None = None,
    ended_at: float | None = None,
    **attributes: Any,
) -> None:
    """After a durable wait returned (workflow code): its span, unless the journal answered it
    (then the execution that really waited, or a replay of it, already did). `was_replayed`:
    what `wait_replayed()` said right after the wait, when steps ran since. `ended_at`: when
    the wait really ended, if before now (a decision made while no execution waited)."""
    if was_replayed if was_replayed is not None else replayed(dbos_waiters.last_recv_id()):
        return
    now = time.time()
    end = min(ended_at, now) if ended_at is not None else now
    wait_span(kind, tool_name, started_at=started_at or end, ended_at=end, **attributes)
