"""What a step received, kept until its checkpoint is recorded: a retry never asks again.

A step body that fails on a transient database error after it received something (the
model's response, a read tool's result) is run again (`stepping.run_step`, inside the step;
or by a later execution of the same workflow in this process). Everything before the
failure runs again with it, and a model call is paid for twice. A pool that checks a
connection before lending it narrows that window (the server may go between the check and
the statement); it does not close it.

`keep(what, receive)` inside a step: the value `receive()` gave on an earlier attempt of the
same step (same workflow id, same step id) in this process, else `receive()`'s, kept. A
retry repeats only the statements. Values are kept as Python objects in memory, never
pickled or written anywhere (they are what the checkpoint will record, once it is), and:
- dropped when the step's checkpoint is recorded (`step_scope`, opened by `run_step`);
- dropped when the workflow's execution ends in this process: its task's end drops them,
  whatever workflow it is (a custom orchestration's, a child episode's, a workflow of your
  own calling the primitives); the built-in ones also call `forget_workflow`;
- bounded (`MAX_KEPT`, oldest out first), so a workflow that dies between steps and never
  ends here cannot grow the worker.

A worker that dies loses them: the next execution asks again, as before (the crash matrix's
"before the checkpoint" boundaries).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from dbos import DBOS

T = TypeVar("T")

Key = tuple[str, int, str]

#: Values kept at most, over every step in flight in this process.
MAX_KEPT = 2048

_kept: OrderedDict[Key, Any] = OrderedDict()
#: Steps' bodies run on the loop, but a sync body may call in from a thread.
_lock = threading.Lock()
#: The keys kept by the step `run_step` is running (a list shared with the body's copies of
#: the context: the body runs in a copy, on the loop or on a thread).
_scope: contextvars.ContextVar[list[Key] | None] = contextvars.ContextVar(
    "ledgerloop_keep_scope", default=None
)


def _step_key(what: str) -> Key | None:
    workflow_id, step_id = DBOS.workflow_id, DBOS.step_id
    if workflow_id is None or step_id is None:
        return None  # not inside a step (a unit test, a replay harness): nothing to keep
    return (str(workflow_id), int(step_id), what)


async def keep(what: str, receive: Callable[[], Awaitable[T]]) -> T:
    """`receive()`'s value, or the one it gave this step's earlier attempt (`what` names
    it among the step's received values: "model", "read {call id}")."""
    key = _step_key(what)
    if key is None:
        return await receive()
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            kept: T = _kept[key]
            return kept
    value = await receive()
    with _lock:
        _kept[key] = value
        while len(_kept) > MAX_KEPT:
            _kept.popitem(last=False)
    _forget_at_end(key[0])
    scope = _scope.get()
    if scope is not None:
        scope.append(key)
    return value


#: The workflows whose kept values each execution's task drops when it ends.
_hooked: weakref.WeakKeyDictionary[asyncio.Task[Any], set[str]] = weakref.WeakKeyDictionary()


def _forget_at_end(workflow_id: str) -> None:
    # An async step body runs on its workflow execution's task: when that task is done, the
    # execution ended here (returned, failed, or was cancelled), and nothing kept for it can
    # be asked for again by this execution.
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return
    if task is None:
        return
    with _lock:
        hooked = _hooked.setdefault(task, set())
        if workflow_id in hooked:
            return
        hooked.add(workflow_id)
    task.add_done_callback(lambda _task: forget_workflow(workflow_id))


@contextmanager
def step_scope() -> Iterator[Callable[[], None]]:
    """Around one step's run: yields `recorded()`, to call once its checkpoint is (what the
    step kept is dropped then). A step that raised keeps its values for a later execution
    of the same step in this process, until the workflow ends or the bound evicts them."""
    keys: list[Key] = []
    token = _scope.set(keys)

    def recorded() -> None:
        with _lock:
            for key in keys:
                _kept.pop(key, None)
        keys.clear()

    try:
        yield recorded
    finally:
        _scope.reset(token)


def forget_workflow(workflow_id: str) -> None:
    """Drop whatever the workflow's steps kept: its execution in this process ended."""
    with _lock:
        for key in [k for k in _kept if k[0] == workflow_id]:
            del _kept[key]


def kept_count() -> int:
    """How many values are kept (tests, and the bound's check)."""
    return len(_kept)
