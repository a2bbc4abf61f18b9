"""The one place Ledgerloop reads DBOS's in-process internals (dbos 3.4): message waiters,
and the workflow's operation counter.

DBOS's notification listener turns each `pg_notify` of a message to `workflow::topic` into a
signal on the waiters registered under that key. Two things use it:

- hibernation asks whether a wait's message is arriving (then it must not cancel the wait);
- the act step watches for its effect's outcome for a moment, so a quick downstream settles
  the step without the workflow's durable `recv` (see write_steps.record_effect).

Both degrade safely when the internals move: `arriving` answers yes (never hibernate), and a
watch that cannot register just times out (the durable wait then does the work). The tests
of both features fail if either stops working, which is how an upgrade would be caught.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dbos._context import get_local_dbos_context
from dbos._dbos import _get_dbos_instance
from dbos._utils import LoopAwareEvent


def _map_and_key(workflow_id: str, topic: str) -> tuple[Any, str, Any]:
    sys_db = _get_dbos_instance()._sys_db
    key, components = sys_db._waiter(workflow_id, topic)
    return sys_db.notifications_map, key, components


def arriving(workflow_id: str, topic: str) -> bool:
    """Has the listener signalled a waiter of `workflow_id`'s `topic`?"""
    try:
        waiters, key, _ = _map_and_key(workflow_id, topic)
        signal = waiters.get(key)
        if signal is None:
            return False
        with signal._lock:
            return any(event.is_set() for event in signal._waiters)
    except AttributeError:
        return True


class Watch:
    def __init__(self, event: LoopAwareEvent | None) -> None:
        self._event = event

    async def wait(self, timeout_s: float) -> bool:
        """True once a message to the topic was notified (it may be any of its messages)."""
        if self._event is None:
            return False
        return await self._event.wait_async(timeout_s)

    def fired(self) -> bool:
        """Whether a message to the topic was notified since the watch began (or was cleared)."""
        return self._event is not None and self._event.is_set()

    def clear(self) -> None:
        if self._event is not None:
            self._event.clear()


@contextmanager
def watch(workflow_id: str, topic: str) -> Iterator[Watch]:
    """Be signalled (without consuming anything) when a message to `topic` is sent. Enter it
    before the write that leads to the message, so no notification falls in between."""
    try:
        waiters, key, components = _map_and_key(workflow_id, topic)
    except AttributeError:
        yield Watch(None)
        return
    event = LoopAwareEvent()
    waiters.add(key, event, components)
    try:
        yield Watch(event)
    finally:
        waiters.pop(key, event)


def last_recv_id() -> int | None:
    """The operation id of the workflow's latest `recv`, called from workflow code right after
    it. A recv takes two ids: its own, then its timeout's (a DBOS.sleep record).

    Tracing compares it with where the journal ended when the execution started, to tell a
    wait that really ended here from one the journal answered. None outside a workflow.
    """
    ctx = get_local_dbos_context()
    if ctx is None or not ctx.is_workflow():
        return None
    return int(ctx.function_id) - 1


def last_step_id() -> int | None:
    """The operation id of the workflow's latest step, called from workflow code right after
    it (DBOS gives each step the next id). None outside a workflow."""
    ctx = get_local_dbos_context()
    if ctx is None or not ctx.is_workflow():
        return None
    return int(ctx.function_id)


def in_workflow() -> bool:
    """Whether this code runs in a real DBOS workflow (not, say, a replay harness that answers
    the workflow's operations from a journal: tracing then emits and records nothing)."""
    ctx = get_local_dbos_context()
    return ctx is not None and ctx.is_workflow()
