"""Messages to a running agent, on the workflow's side (POST /v1/runs/{id}/messages sends them).

    messages-{i}            the built-in loop, at the boundary before turn i: the run's
                            pending messages join the conversation as a user message
    message-wait-{n}[-{k}]  wait_for_message: a custom orchestration waits for the next one

A message is taken by a step, so its journaled result is what a replay adds, at the same
place. Whether a boundary takes at all is not a step (a step per turn would cost every run
a commit per turn for messages nearly none of them get):

- live, the boundary takes when this execution was told of a message (DBOS's notification
  of the message's wake-up, watched without consuming it), and at the first boundary an
  execution reaches live, after one read of the pending rows (a message may have come
  while no execution listened);
- replaying (a resumed execution, before the end of its journal), it takes exactly where
  the journal shows a `messages-{i}` step, read once per resumed execution.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from dbos import DBOS

from ledgerloop.agent import dbos_waiters
from ledgerloop.agent.context import Message, RunContext
from ledgerloop.agent.hibernation import wait_message
from ledgerloop.agent.stepping import CODE_STEP, pooled, pooled_autocommit, run_step
from ledgerloop.db.sql import load_queries
from ledgerloop.failures import retry_transient
from ledgerloop.runs.messages import (
    MESSAGE_TOPIC,
    run_message_pending,
    run_message_take,
)
from ledgerloop.runtime import get_runtime

Q = load_queries("ledgerloop.agent", "messages.sql")


@dataclass(frozen=True)
class Received:
    """A message a person sent the run (what `wait_for_message` returns)."""

    id: str
    text: str
    sent_by: str


class _Inbox:
    """One execution's view of the run's messages (never journaled: it only decides whether
    a boundary takes, and the journal answers that for a replay)."""

    def __init__(self, run_id: str, resumed: bool, signal: dbos_waiters.Watch) -> None:
        self.run_id = run_id
        self.resumed = resumed
        self.signal = signal
        self.checked = False
        self.journal: tuple[int, frozenset[str]] | None = None

    async def due(self, run: RunContext, name: str) -> bool:
        if self.resumed:
            if self.journal is None:
                self.journal = await asyncio.to_thread(_transient_safe(_journal), self.run_id)
            end, taken_at = self.journal
            if name in taken_at:
                return True
            if (dbos_waiters.last_step_id() or 0) + 1 <= end:
                return False  # the journal goes on past here without a take
        if self.signal.fired():
            self.signal.clear()  # before the take: a message during it fires again
            self.checked = True
            return True
        if not self.checked:
            self.checked = True
            return bool(
                await asyncio.to_thread(
                    _transient_safe(pooled_autocommit(run_message_pending)),
                    run.run_id,
                    list(run.messages_taken),
                )
            )
        return False


P = ParamSpec("P")
R = TypeVar("R")


def _transient_safe(fn: Callable[P, R]) -> Callable[P, R]:
    """A read between steps, outside any step's retry: a database away for a while (a
    restart, a failover) is waited out within the step retry budget, as in a step, instead of
    failing the run."""
    budget = get_runtime().settings.step_retry_budget_s
    return retry_transient(fn, budget, f"run {DBOS.workflow_id} reading its messages")


_inbox: contextvars.ContextVar[_Inbox | None] = contextvars.ContextVar(
    "ledgerloop_inbox", default=None
)


@contextmanager
def listening(run_id: str, resumed: bool) -> Iterator[None]:
    """Around an execution of the run's workflow: its turn boundaries take messages. Outside
    one (a replay harness) boundaries take nothing."""
    if not dbos_waiters.in_workflow():
        yield
        return
    with dbos_waiters.watch(run_id, MESSAGE_TOPIC) as signal:
        token = _inbox.set(_Inbox(run_id, resumed, signal))
        try:
            yield
        finally:
            _inbox.reset(token)


def _journal(run_id: str) -> tuple[int, frozenset[str]]:
    with get_runtime().pool.connection() as conn:
        row = conn.execute(Q["journal_message_steps"], {"workflow_id": run_id}).fetchone()
    assert row is not None
    return int(row["journal_end"]), frozenset(row["taken_at"])


#: Set by a replay harness (deploy.replay), outside a real workflow: whether the journal has
#: an operation of a name, so a boundary takes messages where the run did.
journal_ahead: contextvars.ContextVar[Callable[[str], bool] | None] = contextvars.ContextVar(
    "ledgerloop_journal_ahead", default=None
)


async def messages_due(run: RunContext, i: int) -> bool:
    """Whether the boundary before turn `i` takes messages (workflow code, see above)."""
    name = f"{run.scope}messages-{i}"
    inbox = _inbox.get()
    if inbox is None:
        ahead = journal_ahead.get()
        return ahead is not None and ahead(name)
    return await inbox.due(run, name)


async def take_messages(run: RunContext, i: int, *, join: bool = True) -> list[Received]:
    """Step `messages-{i}`: the run's pending messages join the conversation, oldest first,
    as text blocks of a user message (the last one, when the conversation ends with a user
    message not yet in memory). Call it when `messages_due` says so. `join=False`: taken,
    and joined later (`join_conversation`), after the previous turn's tool results."""
    taken: list[dict[str, Any]] = await run_step(
        f"{run.scope}messages-{i}",
        CODE_STEP,
        pooled(run_message_take),
        run.run_id,
        list(run.messages_taken),
    )
    received = [Received(m["id"], m["text"], m["sent_by"]) for m in taken]
    run.messages_taken.extend(m.id for m in received)
    if join:
        join_conversation(run, received)
    return received


def join_conversation(run: RunContext, received: list[Received]) -> None:
    """Messages taken by `take_messages(..., join=False)` join the conversation."""
    if not received:
        return
    blocks = [{"type": "text", "text": m.text} for m in received]
    last = run.messages[-1] if run.messages else None
    if last is not None and last.get("role") == "user" and run.unsaved and run.unsaved[-1] is last:
        content = last["content"]
        before = [{"type": "text", "text": content}] if isinstance(content, str) else content
        merged: Message = {**last, "content": [*before, *blocks]}
        run.messages[-1] = merged
        run.unsaved[-1] = merged
        return
    # The conversation ends with a saved message (or an assistant's): a user message of its
    # own (the Messages API joins consecutive user turns).
    message: Message = {"role": "user", "content": blocks}
    run.messages.append(message)
    run.unsaved.append(message)


def _take_one(run_id: str, taken: list[str]) -> dict[str, Any]:
    messages = pooled(run_message_take)(run_id, taken, 1)
    return {"message": messages[0] if messages else None, "now": time.time()}


async def wait_for_message(run: RunContext, timeout: float) -> Received | None:
    """Wait durably for the next message to the run (a custom orchestration's primitive):
    the message, or None once `timeout` seconds (capped by the run's deadline) passed.

    Step `message-wait-{n}` takes a message already waiting; otherwise the run waits for
    the message's wake-up like an approval waits for its decision: holding no worker thread,
    hibernated when the wait is long, and resumed by any worker after a crash. Every wake-up
    is followed by a step (`message-wait-{n}-{k}`) that reads the record, so a wake-up for
    a message the run already took only waits again. The message does not join the
    conversation by itself; the orchestration decides what to do with it."""
    n = run.message_waits
    run.message_waits += 1
    name = f"{run.scope}message-wait-{n}"
    seen: dict[str, Any] = await run_step(
        name, CODE_STEP, _take_one, run.run_id, list(run.messages_taken)
    )
    until = min(seen["now"] + max(0.0, timeout), run.deadline)
    wakes = 0
    inbox = _inbox.get()
    while seen["message"] is None and seen["now"] < until:
        if inbox is not None:
            # The step after the wake reads the record; a set signal would tell hibernation
            # a message is arriving and keep the run resident for the whole wait.
            inbox.signal.clear()
        await wait_message(MESSAGE_TOPIC, until)
        wakes += 1
        seen = await run_step(
            f"{name}-{wakes}", CODE_STEP, _take_one, run.run_id, list(run.messages_taken)
        )
    run.now = max(run.now, seen["now"])
    found = seen["message"]
    if found is None:
        return None
    run.messages_taken.append(found["id"])
    return Received(found["id"], found["text"], found["sent_by"])
