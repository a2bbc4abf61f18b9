"""The check before every step body: this worker's fence (ledgerloop.fleet.fence).

`fenced(fn, hold)` wraps a step body. It costs one comparison while the worker's lease holds.
Past it, the body waits for the heartbeat to land, then asks the database whether this
execution still owns its workflow, and stops if not; DBOS then records nothing for the step.
The check sits inside the body (after DBOS's replay check), so a recorded step is answered
from the journal as before and a lost run's next step never starts here.

A body that passed the check counts as under way (`Fence.active`) until its caller releases
the `hold`, which `run_step` does only once DBOS has recorded the step's output: a stopping
worker that ended the execution between the body's return and that record would leave a
finished model call unrecorded, to be paid for again by the next worker.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any, TypeVar, cast

from dbos import DBOS

from ledgerloop.db.sql import load_queries
from ledgerloop.fleet import dbos_internals
from ledgerloop.fleet.fence import Fence, FenceClosed
from ledgerloop.runtime import Runtime, get_runtime

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger(__name__)

Q = load_queries("ledgerloop.fleet")


def confirm_owner(runtime: Runtime, fence: Fence, workflow_id: str, owner: str | None) -> None:
    """Raise DBOS's lost-ownership error unless `owner` still owns `workflow_id`."""
    with runtime.pool.connection() as conn:
        row = conn.execute(Q["workflow_owner"], {"workflow_id": workflow_id}).fetchone()
    if owner is None or row is None or row["owner_xid"] != owner or row["status"] != "PENDING":
        log.info(
            "run %s was taken over while this worker was silent; its execution here stops "
            "before its next step",
            workflow_id,
        )
        raise dbos_internals.lost_ownership(workflow_id)
    fence.verified(owner)


class Hold:
    """Whether a step's body entered the fence; released once the step's output is recorded."""

    __slots__ = ("_fence",)

    def __init__(self) -> None:
        self._fence: Fence | None = None

    def take(self, fence: Fence) -> None:
        # Once per step, however many attempts its transient-failure retries make.
        if self._fence is None:
            fence.enter()
            self._fence = fence

    def release(self) -> None:
        if self._fence is not None:
            self._fence.leave()
            self._fence = None


def fenced(fn: F, hold: Hold) -> F:
    """`fn` as a step body that starts only while this worker may run steps."""
    if inspect.iscoroutinefunction(fn):

        @wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            runtime = get_runtime()
            fence = runtime.fence
            if fence is None:
                return await fn(*args, **kwargs)
            owner = dbos_internals.execution_owner()
            if not fence.trusted(owner):
                workflow_id = DBOS.workflow_id or ""
                try:
                    await fence.wait_renewed_async()
                except FenceClosed:
                    raise dbos_internals.lost_ownership(workflow_id) from None
                await asyncio.to_thread(confirm_owner, runtime, fence, workflow_id, owner)
            hold.take(fence)
            return await fn(*args, **kwargs)

        return cast(F, run_async)

    @wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        runtime = get_runtime()
        fence = runtime.fence
        if fence is None:
            return fn(*args, **kwargs)
        owner = dbos_internals.execution_owner()
        if not fence.trusted(owner):
            workflow_id = DBOS.workflow_id or ""
            try:
                fence.wait_renewed()
            except FenceClosed:
                raise dbos_internals.lost_ownership(workflow_id) from None
            confirm_owner(runtime, fence, workflow_id, owner)
        hold.take(fence)
        return fn(*args, **kwargs)

    return cast(F, run)


@contextmanager
def executing() -> Iterator[None]:
    """Around a workflow execution: the fence knows its task until the task is done, to end
    it when the worker stops; an execution that lost its run ends instead of being parked."""
    fence = get_runtime().fence
    task = asyncio.current_task()
    if fence is None or task is None:
        yield
        return
    fence.executions.add(task)
    workflow_id = DBOS.workflow_id
    if workflow_id:
        fence.running[workflow_id] = task
        owner = dbos_internals.execution_owner()
        if owner is not None:
            fence.owners[workflow_id] = owner
    # Until the task is done, not until this block ends: DBOS goes on with the task after the
    # workflow function returns (writing the outcome, or parking the execution).
    task.add_done_callback(fence.executions.discard)
    if workflow_id:
        task.add_done_callback(lambda t: _not_running(fence, workflow_id, t))
    try:
        yield
    except BaseException as exc:
        if dbos_internals.is_lost_ownership(exc):
            # DBOS would park this execution: poll for the new owner's outcome once a second,
            # for as long as the run lasts (days, when it waits on a person), and a stopping
            # worker's shutdown would break that poll with a traceback. Nothing here needs
            # that outcome: the task ends at the park's first wait, recording nothing.
            task.cancel()
        raise


def _not_running(fence: Fence, workflow_id: str, task: asyncio.Task[Any]) -> None:
    # A newer execution of the same workflow (claimed again here) keeps its entry.
    if fence.running.get(workflow_id) is task:
        del fence.running[workflow_id]
        owner = fence.owners.pop(workflow_id, None)
        fence.stale.discard(owner or "")


def borrow_guard(fence: Fence, wait_s: float) -> Callable[[], None]:
    """The check before a step's statement borrows a connection (db.connect.guard_borrows).
    Outside a workflow execution: nothing. Inside one: while a heartbeat has failed, wait
    (at most `wait_s`) for the one that lands again and its rewind check; then refuse an
    execution whose run that check sent back to the journal (its step body was under way
    when the database went back in time: what it would write rests on a past the database
    no longer has)."""

    def guard() -> None:
        owner = dbos_internals.execution_owner()
        if owner is None:
            return
        fence.wait_valid(wait_s)
        if owner in fence.stale:
            raise dbos_internals.lost_ownership(DBOS.workflow_id or "")

    return guard
