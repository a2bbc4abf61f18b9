"""The worker's side of the live stream: a step execution's start, its model's text deltas
and its tools' calls, batched into `run_text` rows.

Each step execution has a `CallText`: each text delta of a streamed model call (`write`) and
each read tool's call and result (`mark`) are queue puts: the step never waits on the
database for them. One thread per process writes what has
queued since its last write, one statement per step execution with something pending
(migration 0033's trigger then notifies `run_id:id` on commit). While a statement is in
flight the next items gather, so a fast model costs a statement per round trip, not per
delta. The first write of an execution numbers its attempt (1, 2, ... per run and step).

The rows are the live copy only: the journal keeps one final message per model call. A
write that fails drops its batch (a subscriber then sees a jump in `seq`); the step is not
affected. The thread also sweeps the rows of runs finished for a while.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import PoolClosed

from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries

Q = load_queries("ledgerloop.streams")

log = logging.getLogger(__name__)

#: Deltas of finished runs are deleted this long after the run finished.
SWEEP_AFTER_S = 60.0
#: How often the writer sweeps.
SWEEP_EVERY_S = 60.0
#: How long a batch without text waits for more (text is written at once).
LINGER_S = 0.005


@dataclass(eq=False)
class CallText:
    """One step execution's live events: its model's text and its read tools."""

    run_id: uuid.UUID
    step: str
    publisher: TextPublisher
    #: The step's attempt, known after the first batch is written (the writer's thread only).
    attempt: int | None = None
    #: Deltas handed over so far / written so far (their index in this call's text).
    given: int = 0
    written: int = 0
    #: Text deltas handed over (a step without text does not wait for its writes).
    texts: int = 0
    #: Queued, not yet written: ("text", delta) or (kind, data).
    pending: list[tuple[str, Any]] = field(default_factory=list)
    #: Set once every delta given so far is written (or dropped).
    flushed: threading.Event = field(default_factory=threading.Event)
    _waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    def write(self, text: str) -> None:
        """A text delta of the step's model call."""
        if text:
            self.texts += 1
            self.mark("text", text)

    def mark(self, kind: str, data: Any = None) -> None:
        """Something else the step did: "tool.called", "tool.result" (`data`: a small
        JSON object)."""
        self.flushed.clear()
        self.given += 1
        self.publisher.queue.put((self, (kind, data)))

    async def drained(self, timeout: float) -> None:
        """Wait (on the loop, no thread) until everything given so far is written, at most
        `timeout`, when the step wrote text: its durable events then come after its text, so
        a stream never closes on the run's end before the last delta. A step with only read
        tools to tell does not wait (their events may follow its step.finished)."""
        if self.texts == 0:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiter = (loop, future)
        # `given` is final here (the step publishes nothing more), and the writer has seen it
        # for every item it took: once `written` reaches it, all is written.
        if self.written >= self.given:
            return
        with suppress(TimeoutError):
            await asyncio.wait_for(future, timeout)

    def _settled(self) -> None:
        """The writer's thread: everything given is written (or dropped)."""
        self.flushed.set()
        waiter = self._waiter
        if waiter is not None:
            loop, future = waiter
            loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class TextPublisher:
    """One writer thread per process; `open(run_id, step)` for each streamed model call."""

    def __init__(self, connection: Callable[[], AbstractContextManager[Conn]]) -> None:
        self.connection = connection
        self.queue: queue.SimpleQueue[tuple[CallText, tuple[str, Any]] | None] = queue.SimpleQueue()
        #: Statements written (the benchmark reads it).
        self.statements = 0
        #: Set when the connections it writes through are gone for good (a closed pool):
        #: the thread has ended, and a new publisher is needed.
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledgerloop-text", daemon=True)
        self._thread.start()

    def open(self, run_id: str | uuid.UUID, step: str) -> CallText:
        return CallText(uuid.UUID(str(run_id)), step, self)

    def close(self) -> None:
        self.queue.put(None)
        self._thread.join(5)

    def _run(self) -> None:
        next_sweep = time.monotonic() + SWEEP_EVERY_S
        stop = False
        while not stop and not self.closed.is_set():
            calls: list[CallText] = []
            wait = SWEEP_EVERY_S
            try:
                # Wait for an item (or the sweep's time), then take all that queued meanwhile;
                # with no text among them, linger a moment for what follows (a read tool's
                # result after its call): text goes at once, the rest in fewer statements.
                while True:
                    item = self.queue.get(timeout=wait)
                    while True:
                        if item is None:
                            stop = True
                        else:
                            call, entry = item
                            if not call.pending:
                                calls.append(call)
                            call.pending.append(entry)
                        try:
                            item = self.queue.get_nowait()
                        except queue.Empty:
                            break
                    if stop or any(kind == "text" for c in calls for kind, _ in c.pending):
                        break
                    wait = LINGER_S
            except queue.Empty:
                pass
            if calls:
                self._write(calls)
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + SWEEP_EVERY_S
                self._sweep()

    def _write(self, calls: list[CallText]) -> None:
        try:
            with self.connection() as conn:
                conn.autocommit = True
                try:
                    for call in calls:
                        pieces, call.pending = call.pending, []
                        row = conn.execute(
                            Q["text_append"],
                            {
                                "run_id": call.run_id,
                                "step": call.step,
                                "attempt": call.attempt,
                                "rows": Jsonb(_rows(pieces, call.written)),
                            },
                        ).fetchone()
                        self.statements += 1
                        call.written += len(pieces)
                        if row is not None and call.attempt is None:
                            call.attempt = int(row["attempt"])
                        if call.written >= call.given:
                            call._settled()
                finally:
                    conn.autocommit = False
        except psycopg.Error as exc:
            self._check_closed(exc)
            log.warning("dropping streamed text of %d model call(s): %s", len(calls), exc)
            for call in calls:
                call.written += len(call.pending)
                call.pending = []
                call._settled()

    def _sweep(self) -> None:
        try:
            with self.connection() as conn:
                conn.autocommit = True
                try:
                    conn.execute(Q["text_sweep"], {"after_s": SWEEP_AFTER_S})
                finally:
                    conn.autocommit = False
        except psycopg.Error as exc:
            if not self._check_closed(exc):
                log.warning("sweeping streamed text failed: %s", exc)

    def _check_closed(self, exc: psycopg.Error) -> bool:
        """A closed pool stays closed (its runtime ended): the thread ends too."""
        if isinstance(exc, PoolClosed):
            self.closed.set()
            return True
        return False


def _rows(pieces: list[tuple[str, Any]], first: int) -> list[dict[str, Any]]:
    """The rows of one write: consecutive text deltas joined into one row, each other item a
    row of its own; `seq` is the index of the row's first item in the execution's stream."""
    rows: list[dict[str, Any]] = []
    for index, (kind, data) in enumerate(pieces, start=first):
        if kind == "text" and rows and rows[-1]["kind"] == "text":
            rows[-1]["text"] += data
            continue
        text, extra = (data, None) if kind == "text" else ("", data)
        rows.append({"ord": len(rows), "kind": kind, "seq": index, "text": text, "data": extra})
    return rows
