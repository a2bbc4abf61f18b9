"""A step execution's live events: its start, its read tools, its model's text as written.

One publisher (one writer thread, streams/publish.py) per runtime's pool in the process,
made on first use. `run_step` wraps each step body with `announced`: when the body really
runs (not when the journal answers the step), it opens the execution's `CallText`; the
body's model call and read tools publish through it (`current`), so they share its attempt.
A step that publishes nothing writes nothing (its start is told by the first thing it
publishes: the stream's `step.started`). Off with LEDGERLOOP_STREAM_TEXT=false.
"""

from __future__ import annotations

import inspect
import threading
import uuid
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, TypeVar, cast

from dbos import DBOS

from ledgerloop.runtime import Runtime
from ledgerloop.streams.publish import CallText, TextPublisher

F = TypeVar("F", bound=Callable[..., Any])

_publishers: dict[int, TextPublisher] = {}
#: The executions whose bodies are running in this process, by (run id, step name).
_live: dict[tuple[str, str], CallText] = {}
_lock = threading.Lock()


def _publisher(rt: Runtime) -> TextPublisher:
    pool = rt.pool
    with _lock:
        publisher = _publishers.get(id(pool))
        if publisher is None or publisher.closed.is_set():
            publisher = _publishers[id(pool)] = TextPublisher(pool.connection)
    return publisher


def _run_id(workflow_id: str | None) -> str | None:
    if workflow_id is None:
        return None
    try:
        return str(uuid.UUID(workflow_id))
    except ValueError:
        return None  # not a run's workflow


def announced(rt: Runtime, name: str, fn: F) -> F:
    """`fn` as a step body with an execution of its own on the live stream each time it
    runs."""
    run_id = _run_id(DBOS.workflow_id)
    if run_id is None or not rt.settings.stream_text:
        return fn
    key = (run_id, name)

    def start() -> None:
        call = _publisher(rt).open(run_id, name)
        with _lock:
            _live[key] = call

    if inspect.iscoroutinefunction(fn):

        @wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            start()
            return await fn(*args, **kwargs)

        return cast(F, run_async)

    @wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        start()
        return fn(*args, **kwargs)

    return cast(F, run)


def ended(name: str) -> None:
    """The step `name` of the current workflow is over (recorded, or raised)."""
    run_id = _run_id(DBOS.workflow_id)
    if run_id is not None:
        with _lock:
            _live.pop((run_id, name), None)


def current(rt: Runtime, run_id: str, step: str) -> CallText | None:
    """Where the running step `step` publishes (None when live events are off)."""
    if not rt.settings.stream_text:
        return None
    with _lock:
        call = _live.get((run_id, step))
    return call if call is not None else _publisher(rt).open(run_id, step)


async def told(
    live: CallText | None, call: dict[str, Any], result: Awaitable[dict[str, Any]]
) -> dict[str, Any]:
    """A read tool's `result` (a tool_result block), its call and result told to `live`."""
    if live is None:
        return await result
    what = {"tool": str(call["name"]), "tool_call_id": str(call["id"])}
    live.mark("tool.called", what)
    answer = await result
    live.mark("tool.result", {**what, "is_error": bool(answer.get("is_error"))})
    return answer
