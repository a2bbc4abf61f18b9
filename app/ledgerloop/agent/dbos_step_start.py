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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from dbos._outcome import DeferredResult, Pending

_original: Any = None


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


def applies() -> bool:
    """Whether DBOS's `Pending` is the one this replaces (its `then` and `_wrap` as above)."""
    return (
        callable(getattr(Pending, "then", None))
        and callable(getattr(Pending, "_wrap", None))
        and "_func" in getattr(Pending, "__slots__", ())
        and callable(getattr(DeferredResult, "resolve_async", None))
    )


def install() -> bool:
    """Start async steps' bodies on the loop (once per process); False when DBOS's own
    `then` stays (see `applies`)."""
    global _original
    if _original is not None:
        return True
    if not applies():
        return False
    _original = Pending.then
    Pending.then = _then_on_loop  # type: ignore[method-assign]
    return True


def uninstall() -> None:
    """DBOS's own `then` again."""
    global _original
    if _original is not None:
        Pending.then = _original  # type: ignore[method-assign]
        _original = None


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
