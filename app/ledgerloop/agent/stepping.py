"""Step plumbing: how a step body becomes a named, journaled DBOS step. A leaf module.

Everything that runs a durable step goes through `run_step`, so the step's name (its identity
in the journal, `think-{i}`, `tool-{i}-{call_id}`...) is always given explicitly and never
derived from a Python function name that a refactor could change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import wraps
from typing import Any, Concatenate, ParamSpec, TypeVar

from dbos import DBOS, StepOptions

from ledgerloop.agent.keep import step_scope
from ledgerloop.agent.text_stream import announced, ended
from ledgerloop.db.connect import Conn
from ledgerloop.failures import retry_transient
from ledgerloop.faults import after_step
from ledgerloop.fleet.guard import Hold, fenced
from ledgerloop.runtime import get_runtime

P = ParamSpec("P")
R = TypeVar("R")

#: The DBOS workflow every run executes, and the queue its executions are dispatched from.
WORKFLOW_NAME = "ledgerloop_run"
QUEUE_NAME = "ledgerloop_runs"

#: Code steps (memory, bookkeeping, tools). DBOS does not retry them: it would retry a bug
#: three times within about three seconds, and give up on a database outage just as fast.
#: `run_step` retries transient failures inside the step instead, with capped backoff within
#: LEDGERLOOP_STEP_RETRY_BUDGET_S (ledgerloop/failures.py); anything else ends the run.
CODE_STEP: StepOptions = {"retries_allowed": False}
#: A model call: one attempt (the client's own timeout bounds it at 240 s).
MODEL_STEP: StepOptions = {"retries_allowed": False}


async def run_step(name: str, options: StepOptions, fn: Callable[..., Any], *args: Any) -> Any:
    """Run `fn(*args)` as the step `name`: once, or its journaled result on a replay.

    Transient failures (the database away for a minute) are retried inside the step within
    the budget, without asking again for what the body received before (agent.keep);
    anything else is raised at once, for the workflow to end the run. Each attempt is
    fenced: it starts only while this worker may run steps (fleet.fence).
    """
    named: StepOptions = {**options, "name": name}
    rt = get_runtime()
    budget = rt.settings.step_retry_budget_s
    hold = Hold()
    body = retry_transient(fenced(fn, hold), budget, f"run {DBOS.workflow_id} step {name}")
    # Its start goes to the run's live stream when it runs (not when the journal answers).
    body = announced(rt, name, body)
    # What the body received (agent.keep) outlives a transient failure after it, and is
    # dropped once DBOS has recorded what the body returned.
    with step_scope() as recorded:
        try:
            result = await DBOS.run_step_async(named, body, *args)
        finally:
            # The body counts as under way until DBOS has recorded what it returned
            # (fleet.guard).
            hold.release()
            ended(name)
        recorded()
    after_step(name)
    return result


async def db_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a sync store function on a pooled connection, off the event loop."""

    def call() -> Any:
        with get_runtime().pool.connection() as conn:
            return fn(conn, *args, **kwargs)

    return await asyncio.to_thread(call)


def pooled(fn: Callable[Concatenate[Conn, P], R]) -> Callable[P, R]:
    """A store function as a step body: it borrows a pooled connection for the call.

    DBOS runs a sync step body on its thread pool, so the event loop never blocks on it.
    """

    @wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with get_runtime().pool.connection() as conn:
            return fn(conn, *args, **kwargs)

    return call


def pooled_autocommit(fn: Callable[Concatenate[Conn, P], R]) -> Callable[P, R]:
    """`pooled`, in autocommit: for a body whose writes are one statement (no BEGIN and
    COMMIT around it, two round trips fewer)."""

    @wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with get_runtime().pool.connection() as conn:
            conn.autocommit = True
            try:
                return fn(conn, *args, **kwargs)
            finally:
                conn.autocommit = False

    return call
