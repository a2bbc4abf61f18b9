"""Failure classes and what each one gets: a transient failure is retried, a bug is not.

A step body that meets a transient failure (the database restarting or failing over, a
connection reset, a serialization conflict, a pool with no connection to give) is run again
with capped exponential backoff until `budget_s` has passed; the default budget
(`LEDGERLOOP_STEP_RETRY_BUDGET_S`, 120 s) outlasts a database outage of a minute. Anything
else (a KeyError in a tool handler, a TypeError in a step) is a bug or a permanent refusal:
running it again in a second gives the same answer, so it is raised at once, and the run's
workflow ends the run `failed` with reason `internal_error`.

The workflow reads a step's error back from DBOS's journal on replay, where it is no longer
the original exception but a `PortableWorkflowError` carrying the original class name; so
workflow code judges an error by `error_name`, never by isinstance.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import psycopg.errors
import sqlalchemy.exc

from ledgerloop.errors import LedgerloopError

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: First backoff and its cap; the delay doubles in between.
BACKOFF_FIRST_S = 0.2
BACKOFF_CAP_S = 5.0

#: DBOS raises these when a replayed workflow no longer matches its journal. Running more steps
#: after one would record them at positions the journal already holds, so the workflow is left
#: to end in ERROR and the sweeper settles its run.
NONDETERMINISM = frozenset(
    {"DBOSUnexpectedStepError", "DBOSStepNondeterminismError", "DBOSPatchNondeterminismError"}
)


def _network_error_types() -> tuple[type[BaseException], ...]:
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx is a dependency
        return (ConnectionError,)
    return (ConnectionError, httpx.TransportError)


_NETWORK = _network_error_types()


def is_transient(exc: BaseException) -> bool:
    """Whether the same operation, unchanged, can succeed a little later."""
    if isinstance(exc, sqlalchemy.exc.TimeoutError):
        return True  # a pool checkout that timed out: nothing ran
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        return exc.orig is not None and is_transient(exc.orig)
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return False  # a statement timeout or an explicit cancel: retrying would undo it
    if isinstance(
        exc,
        (
            psycopg.OperationalError,  # connection lost or refused, shutdown, pool timeout
            psycopg.errors.SerializationFailure,
            psycopg.errors.DeadlockDetected,
        ),
    ):
        return True
    if isinstance(exc, LedgerloopError):
        return exc.retryable
    return isinstance(exc, _NETWORK)


def error_name(exc: BaseException) -> str:
    """The class name of the error, also for one read back from DBOS's journal."""
    name = getattr(exc, "name", None)
    if type(exc).__name__ == "PortableWorkflowError" and isinstance(name, str):
        return name
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ == "DBOSMaxStepRetriesExceeded" and errors:
        return error_name(errors[-1])
    return type(exc).__name__


def describe(exc: BaseException) -> dict[str, str]:
    """Class and message of an error, for the run's history (never for the model)."""
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ == "DBOSMaxStepRetriesExceeded" and errors:
        return describe(errors[-1])
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) else str(exc)
    return {"type": error_name(exc), "message": text[:500]}


def _backoff(attempt: int) -> float:
    return float(min(BACKOFF_FIRST_S * 2 ** (attempt - 1), BACKOFF_CAP_S))


def retry_transient(fn: F, budget_s: float, what: str) -> F:
    """`fn` (sync or async), run again after transient failures until `budget_s` has passed.

    One warning when the first transient failure is met and one when the budget runs out,
    not one per attempt: an outage of a minute would otherwise log hundreds of lines.
    """

    def give_up(started: float, attempt: int, exc: BaseException) -> bool:
        if not is_transient(exc):
            return True
        elapsed = time.monotonic() - started
        if elapsed + _backoff(attempt) > budget_s:
            log.warning(
                "%s: still failing after %d attempts in %.0f s (%s); giving up",
                what,
                attempt,
                elapsed,
                describe(exc)["message"],
            )
            return True
        if attempt == 1:
            log.warning(
                "%s: transient failure (%s: %s); retrying for up to %.0f s",
                what,
                error_name(exc),
                describe(exc)["message"],
                budget_s,
            )
        return False

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            attempt = 0
            while True:
                attempt += 1
                try:
                    return await fn(*args, **kwargs)
                except Exception as exc:
                    if give_up(started, attempt, exc):
                        raise
                await asyncio.sleep(_backoff(attempt))

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if give_up(started, attempt, exc):
                    raise
            time.sleep(_backoff(attempt))

    return run  # type: ignore[return-value]
