"""Long waits leave memory: a run waiting for a message is hibernated, and a message wakes it.

A run waiting for an approval (or for a person to settle an effect) may wait for hours. As a
live DBOS workflow it would hold its coroutine, DBOS's per-workflow state and a waiter the
whole time: tens of kilobytes each, so ten thousand waiting runs would cost hundreds of
megabytes. Instead, once a wait has lasted `hibernate_after_s`:

1. the run's task is cancelled at its `recv`, which DBOS treats like a shutdown: nothing is
   recorded and the workflow stays PENDING (a wait whose message is already arriving, which
   `recv` may be consuming, is left alone);
2. one transaction parks its DBOS workflow as DELAYED until the wait's own deadline, or
   puts it straight back on the queue when its message already arrived;
3. the `wake_hibernated_run` trigger on `dbos.notifications` (db/dbos_objects.sql) moves a
   parked run back to ENQUEUED in the transaction that sends it a message (a decision, an effect's
   outcome), and DBOS enqueues it at the deadline by itself. Any worker may then dequeue it;
   it replays its journal up to the wait, where the message is waiting.

The park and the trigger both lock the workflow's status row first, so a message committed
concurrently is either seen by the park (which then re-enqueues) or sees the parked row
(which it then wakes): no wake is lost. A hibernation is not a failed attempt, so the park
gives back the dispatch DBOS counted against the run's recovery limit.

What this relies on in DBOS beyond its public API is listed in ledgerloop/dbos_internals.py
(a cancelled workflow task records nothing; the DELAYED status and its `delay_until_epoch_ms`;
the queue dispatch of ENQUEUED rows and their owner token; the recovery count; the recv waiter
map), each checked by its contract test in tests/contract/.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from dbos import DBOS

from ledgerloop.agent import tracing
from ledgerloop.agent.dbos_waiters import arriving
from ledgerloop.agent.stepping import QUEUE_NAME
from ledgerloop.db.sql import load_queries
from ledgerloop.faults import hit
from ledgerloop.runtime import get_runtime
from ledgerloop.telemetry import mark_hibernated

log = logging.getLogger(__name__)
Q = load_queries("ledgerloop.agent", "hibernation.sql")

#: A wait this close to its deadline is left alone: DBOS may already be consuming at the end.
_DEADLINE_MARGIN_S = 1.0
#: Backoff while the park cannot reach the database (the task cannot go back to waiting).
_PARK_RETRY_S = (0.1, 0.5, 1.0, 2.0, 5.0)

#: Set by the run workflow: only its waits hibernate, because the wake trigger (migration
#: 0005) wakes only that workflow. A custom DBOS workflow's waits stay resident.
hibernating_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "ledgerloop_hibernating_allowed", default=False
)
_hibernating: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "ledgerloop_hibernating", default=False
)


class _QuietHibernation(logging.Filter):
    """DBOS warns about every cancelled workflow task; a hibernation is not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_hibernating.get() and "task cancelled" in record.getMessage())


logging.getLogger("dbos").addFilter(_QuietHibernation())


@dataclass
class _Wait:
    workflow_id: str
    topic: str
    until: float
    task: asyncio.Task[Any]
    hibernating: bool = False
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


async def wait_message(topic: str, until: float) -> Any:
    """`DBOS.recv_async(topic)` until the epoch time `until` (None when it passes), hibernating
    the run if the wait outlasts the worker's `hibernate_after_s`.

    Only call it from the agent workflow, where a replay re-enters the same wait: hibernating
    ends this execution of the workflow, and the next one resumes from the journal.
    """
    timeout = max(0.0, until - time.time())
    after = get_runtime().settings.hibernate_after_s
    task = asyncio.current_task()
    if (
        not after
        or task is None
        or not hibernating_allowed.get()
        or timeout <= after + _DEADLINE_MARGIN_S
    ):
        return await DBOS.recv_async(topic, timeout)
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None, "wait_message runs inside a workflow"
    wait = _Wait(workflow_id, topic, until, task)
    wait.timer = asyncio.get_running_loop().call_later(after, _hibernate, wait)
    try:
        return await DBOS.recv_async(topic, timeout)
    except asyncio.CancelledError:
        if not wait.hibernating:
            raise
        _hibernating.set(True)
        mark_hibernated()
        hit("hibernate.before_park")
        await _park(wait, await tracing.end_hibernating())
        raise
    finally:
        wait.timer.cancel()


def _hibernate(wait: _Wait) -> None:
    """On the workflow's event loop: end the execution if nothing is about to arrive."""
    if wait.task.done() or wait.until - time.time() <= _DEADLINE_MARGIN_S:
        return
    if arriving(wait.workflow_id, wait.topic):
        return  # DBOS is consuming the message; the wait ends by itself
    wait.hibernating = True
    wait.task.cancel()


async def _park(wait: _Wait, execution: tuple[str, dict[str, Any]] | None) -> None:
    settings = get_runtime().settings
    params = {
        "queue": QUEUE_NAME,
        "workflow_id": wait.workflow_id,
        "topic": wait.topic,
        "executor_id": settings.executor_id,
        "until_ms": int(wait.until * 1000),
    }

    def park() -> str:
        with get_runtime().pool.connection() as conn, conn.transaction():
            row = conn.execute(Q["workflow_lock"], params).fetchone()
            if (
                row is None
                or row["status"] != "PENDING"
                or row["executor_id"] != params["executor_id"]
            ):
                return "gone"  # cancelled, or no longer ours: nothing to park
            waiting = conn.execute(Q["message_waiting"], params).fetchone()
            assert waiting is not None
            query = "workflow_requeue" if waiting["waiting"] else "workflow_park"
            conn.execute(Q[query], params)
            # This execution ended its own span: the next one must not rebuild it.
            tracing.record_hibernated(conn, execution)
            return "requeued" if waiting["waiting"] else "parked"

    # Until it works: the execution is gone and the run, PENDING under this executor, has no
    # one else. A stop (or a crash) meanwhile hands it back to the queue like any other run.
    for attempt in itertools.count(1):
        try:
            outcome = await asyncio.to_thread(park)
            log.debug("run %s hibernation: %s", wait.workflow_id, outcome)
            return
        except Exception as exc:
            delay = _PARK_RETRY_S[min(attempt, len(_PARK_RETRY_S)) - 1]
            log.warning(
                "run %s: parking failed (attempt %d: %s); retrying in %.1f s",
                wait.workflow_id,
                attempt,
                exc,
                delay,
            )
            await asyncio.sleep(delay)
