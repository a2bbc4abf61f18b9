"""An async DBOS step's body starts on the event loop, without a trip through a thread first.

DBOS composes an async step as a `Pending` outcome: the journal check, then the body, then
the checkpoint (`Pending.then(record_step_result)`). `Pending.then(next)` is built on
`Pending._wrap(func, before)`, whose first act is `await asyncio.to_thread(before)`; for
`then`, `before` is `lambda: next`, which does no I/O and returns at once. So every async
step (every think step, the workflow's own start) waits for a thread of the pool and the GIL
before its body runs, and only to be handed back a function it already had. On two cores
with other work on the loop (a write's relay reading its answer, in the same moment), that
hop took 1.2-1.6 ms of a write turn (measured with `scripts/bench turn_write_timeline`).

`install` replaces `Pending.then` with one that runs `next` on a thread after the body, as
DBOS does, and skips the hop before it. Everything else is DBOS's: the pool's configuration
when DBOS asks for it, the exception path (`next` is given a thunk that raises), a
`DeferredResult` resolved on the loop. It applies to the class (DBOS builds a new `Pending`
per step) and is undone by `uninstall`. The contract test in tests/contract checks both
against DBOS's own, result for result, and that one hop is gone
(dbos_internals: `step-start`).

It also replaces `Pending._intercept`, which runs a step's journal check on a thread before
its body, so that a step whose check was answered ahead (db.dbos_journal.take_ahead: by the
checkpoint of a step that carried a write) starts its body at once, with no trip through a
thread: the answer is the one its check would give, nothing recorded and not cancelled.
Only a step's check (DBOS's `check_existing_result`) is ever skipped; the workflow start's
interceptor, and a step without an answer, go to DBOS's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from dbos._context import current_owner_xid, get_local_dbos_context
from dbos._outcome import DeferredResult, Pending

from ledgerloop.db import dbos_journal

_original: Any = None
_original_intercept: Any = None

#: The name of the interceptor DBOS gives a step: its journal check.
STEP_CHECK = "check_existing_result"


async def _then(
    func: Callable[[], Coroutine[Any, Any, Any]],
    next_: Callable[[Callable[[], Any]], Any],
    dbos: Any,
) -> Any:
    if dbos is not None:
        await dbos._configure_asyncio_thread_pool()
    try:
        value = await func()
        result = await asyncio.to_thread(next_, lambda: value)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        failed = exc  # bound outside the except block: the thunk runs on the pool later

        def raised() -> Any:
            raise failed

        result = await asyncio.to_thread(next_, raised)
    if isinstance(result, DeferredResult):
        return await result.resolve_async()
    return result


def _then_on_loop(self: Any, next: Callable[[Callable[[], Any]], Any], *, dbos: Any = None) -> Any:
    func = self._func
    return Pending(lambda: _then(func, next, dbos))


def _answered_ahead(interceptor: Callable[[], Any]) -> bool:
    if getattr(interceptor, "__name__", None) != STEP_CHECK:
        return False
    ctx = get_local_dbos_context()
    if ctx is None or not ctx.workflow_id:
        return False
    owner = current_owner_xid(ctx.workflow_id, ctx)
    return dbos_journal.take_ahead(ctx.workflow_id, ctx.function_id, owner)


async def _intercept(
    func: Callable[[], Coroutine[Any, Any, Any]],
    interceptor: Callable[[], Any],
    *,
    dbos: Any = None,
) -> Any:
    if _answered_ahead(interceptor):
        if dbos is not None:
            await dbos._configure_asyncio_thread_pool()
        return await func()
    return await _original_intercept.__func__(func, interceptor, dbos=dbos)


def applies() -> bool:
    """Whether DBOS's `Pending` is the one this replaces (its `then`, `_wrap` and
    `_intercept` as above)."""
    return (
        callable(getattr(Pending, "then", None))
        and callable(getattr(Pending, "_wrap", None))
        and isinstance(vars(Pending).get("_intercept"), staticmethod)
        and "_func" in getattr(Pending, "__slots__", ())
        and callable(getattr(DeferredResult, "resolve_async", None))
    )


def install() -> bool:
    """Start async steps' bodies on the loop (once per process), without a journal check
    answered ahead; False when DBOS's own `then` and `_intercept` stay (see `applies`)."""
    global _original, _original_intercept
    if _original is not None:
        return True
    if not applies():
        return False
    _original = Pending.then
    _original_intercept = vars(Pending)["_intercept"]
    Pending.then = _then_on_loop  # type: ignore[method-assign]
    Pending._intercept = staticmethod(_intercept)  # type: ignore[method-assign]
    return True


def uninstall() -> None:
    """DBOS's own `then` and `_intercept` again."""
    global _original, _original_intercept
    if _original is not None:
        Pending.then = _original  # type: ignore[method-assign]
        Pending._intercept = _original_intercept  # type: ignore[method-assign]
        _original = _original_intercept = None


def installed() -> bool:
    return _original is not None


@contextmanager
def dbos_own_step_start() -> Iterator[None]:
    """DBOS's own `then` while inside (benchmarks: bare DBOS's workflows, run in a worker's
    process, are measured as DBOS makes them)."""
    was = installed()
    uninstall()
    try:
        yield
    finally:
        if was:
            install()
