"""Fan-out in one process: one notification source, one read per run, many subscribers.

Every subscriber of a run in this process shares one feed: a notification for the run
(`run_id:sequence`, migration 0026) makes the feed read the new events once and wake each
subscriber, which takes them from the feed's bounded buffer. The database sees one LISTEN
per process and one read per run per notification, whatever the number of subscribers; an
idle run costs nothing. A subscriber that fell behind the buffer reads its gap from the
durable record itself, so a slow client costs only its own reads, and only when it reads.

The hub runs on the server's event loop; notifications arrive on the source's thread and
are handed over with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.streams.feed import Page, StreamEvent, started_event
from ledgerloop.streams.source import NotificationSource

log = logging.getLogger(__name__)

#: Where the run event trigger (migration 0026) notifies: `run_id:sequence`.
CHANNEL = "ledgerloop_run_events"
#: Where the model text trigger (migration 0033) notifies: `run_id:id` (a `run_text` row).
TEXT_CHANNEL = "ledgerloop_run_text"

#: Text events a subscriber may have waiting; past it the oldest are dropped (and it is told:
#: a `seq` jump in the next delta).
TEXT_BUFFER = 1024

#: How many recent events a feed keeps for subscribers catching up.
BUFFER = 256

#: Reads a run's record after a sequence (as the owner: a subscription was authorized when
#: it began).
Reader = Callable[[uuid.UUID, int], Awaitable[Page | None]]
#: Reads a run's text deltas after a `run_text` id (None: its latest call's text so far),
#: each with its row id.
TextReader = Callable[[uuid.UUID, int | None], Awaitable[list[tuple[int, StreamEvent]]]]


@dataclass(eq=False)  # each subscription is its own (hashed by identity)
class Subscription:
    run_id: uuid.UUID
    #: The last durable sequence this subscriber has sent.
    cursor: int
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Text deltas not yet sent (ephemeral: they are never read back from the record).
    texts: deque[StreamEvent] = field(default_factory=lambda: deque(maxlen=TEXT_BUFFER))


@dataclass
class _Feed:
    last: int
    status: RunStatus | None = None
    buffer: deque[StreamEvent] = field(default_factory=lambda: deque(maxlen=BUFFER))
    subscribers: set[Subscription] = field(default_factory=set)
    reading: asyncio.Task[None] | None = None
    again: bool = False
    #: The last `run_text` row read (None: none yet, the first read takes the current call's).
    text_last: int | None = None
    text_reading: asyncio.Task[None] | None = None
    text_again: bool = False
    #: The step executions seen publishing: the first thing each publishes is its start.
    started: set[tuple[str, int]] = field(default_factory=set)

    @property
    def finished(self) -> bool:
        return self.status is not None and self.status in TERMINAL


class RunEventHub:
    def __init__(
        self, source: NotificationSource, read: Reader, read_text: TextReader | None = None
    ) -> None:
        self.source = source
        self.read = read
        self.read_text = read_text
        self._feeds: dict[uuid.UUID, _Feed] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        #: Reads of the record the feeds made (tests and the benchmark look).
        self.reads = 0

    def start(self) -> None:
        """Subscribe to the source (on the loop the hub serves)."""
        self._loop = asyncio.get_running_loop()
        self._unsubscribe = [self.source.subscribe(CHANNEL, self._notified)]
        if self.read_text is not None:
            self._unsubscribe.append(self.source.subscribe(TEXT_CHANNEL, self._text_notified))

    def stop(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        for feed in self._feeds.values():
            for task in (feed.reading, feed.text_reading):
                if task is not None:
                    task.cancel()

    @property
    def subscribers(self) -> int:
        return sum(len(feed.subscribers) for feed in self._feeds.values())

    # -- notifications (the source's thread) ------------------------------------------------

    def _notified(self, payload: str | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_notification, payload)

    def _text_notified(self, payload: str | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed() and payload is not None:
            # A lost text notification is not re-read: deltas are ephemeral (a `seq` jump).
            loop.call_soon_threadsafe(self._on_text, payload)

    def _on_text(self, payload: str) -> None:
        run_text, _, last_text = payload.partition(":")
        try:
            run_id, last = uuid.UUID(run_text), int(last_text)
        except ValueError:
            log.warning("ignoring a malformed run text notification %r", payload)
            return
        feed = self._feeds.get(run_id)
        if feed is None or (feed.text_last is not None and last <= feed.text_last):
            return
        if feed.text_reading is not None and not feed.text_reading.done():
            feed.text_again = True
            return
        feed.text_reading = asyncio.get_running_loop().create_task(self._read_text(run_id, feed))

    async def _read_text(self, run_id: uuid.UUID, feed: _Feed) -> None:
        assert self.read_text is not None
        while True:
            feed.text_again = False
            try:
                rows = await self.read_text(run_id, feed.text_last)
                self.reads += 1
            except Exception:
                log.exception("reading run %s's text failed; its deltas are skipped", run_id)
                rows = []
            if rows:
                feed.text_last = rows[-1][0]
                events = self._with_starts(feed, [event for _, event in rows])
                for sub in feed.subscribers:
                    sub.texts.extend(events)
                    sub.wake.set()
            if not feed.text_again:
                return

    @staticmethod
    def _with_starts(feed: _Feed, events: list[StreamEvent]) -> list[StreamEvent]:
        """`events`, each step execution's first one preceded by its `step.started`."""
        told: list[StreamEvent] = []
        for event in events:
            key = (event.data["step"], event.data["attempt"])
            if key not in feed.started:
                feed.started.add(key)
                told.append(started_event(event.data))
            told.append(event)
        return told

    async def text_settled(self, sub: Subscription) -> None:
        """Wait for the run's text read under way, if any: the text committed before the
        run's last event, so it is sent before run.finished."""
        feed = self._feeds.get(sub.run_id)
        while feed is not None and feed.text_reading is not None and not feed.text_reading.done():
            await asyncio.wait({feed.text_reading})

    def take_text(self, sub: Subscription) -> list[StreamEvent]:
        """The text deltas waiting for the subscriber, oldest first."""
        taken = list(sub.texts)
        sub.texts.clear()
        return taken

    def _on_notification(self, payload: str | None) -> None:
        if payload is None:  # some may have been missed: every feed re-reads
            for run_id in list(self._feeds):
                self._refresh(run_id)
            return
        run_text, _, sequence = payload.partition(":")
        try:
            run_id, last = uuid.UUID(run_text), int(sequence)
        except ValueError:
            log.warning("ignoring a malformed run event notification %r", payload)
            return
        feed = self._feeds.get(run_id)
        if feed is not None and last > feed.last:
            self._refresh(run_id)

    # -- feeds ----------------------------------------------------------------------------

    def subscribe(self, run_id: uuid.UUID, cursor: int) -> Subscription:
        """Follow `run_id` live from `cursor` (what the subscriber already sent). The feed
        reads once on creation: events committed between the subscriber's replay and now
        were announced before anyone here listened for them."""
        sub = Subscription(run_id, cursor)
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = _Feed(last=cursor)
            self._refresh(run_id)
        elif feed.last > cursor or feed.finished:
            sub.wake.set()
        feed.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        feed = self._feeds.get(sub.run_id)
        if feed is None:
            return
        feed.subscribers.discard(sub)
        if not feed.subscribers:
            for task in (feed.reading, feed.text_reading):
                if task is not None:
                    task.cancel()
            del self._feeds[sub.run_id]

    def _refresh(self, run_id: uuid.UUID) -> None:
        feed = self._feeds.get(run_id)
        if feed is None:
            return
        if feed.reading is not None and not feed.reading.done():
            feed.again = True  # one read at a time per run; one more after it
            return
        feed.reading = asyncio.get_running_loop().create_task(self._read(run_id, feed))

    async def _read(self, run_id: uuid.UUID, feed: _Feed) -> None:
        while True:
            feed.again = False
            try:
                page = await self.read(run_id, feed.last)
                self.reads += 1
            except Exception:
                log.exception("reading run %s's events failed; subscribers re-read", run_id)
                page = None
            if page is not None:
                feed.buffer.extend(page.events)
                if page.events:
                    feed.last = page.events[-1].id or feed.last
                if page.complete:
                    feed.status = page.status
            for sub in feed.subscribers:
                sub.wake.set()
            if not (feed.again or (page is not None and not page.complete)):
                return

    def take(self, sub: Subscription) -> list[StreamEvent] | None:
        """The events after the subscriber's cursor from the feed's buffer; None when the
        buffer no longer reaches back that far (the subscriber reads its gap itself)."""
        feed = self._feeds.get(sub.run_id)
        if feed is None or sub.cursor >= feed.last:
            return []
        if not feed.buffer or (feed.buffer[0].id or 0) > sub.cursor + 1:
            return None
        return [event for event in feed.buffer if (event.id or 0) > sub.cursor]

    def finished(self, sub: Subscription) -> RunStatus | None:
        """The run's final status once the subscriber has sent all of its record."""
        feed = self._feeds.get(sub.run_id)
        if feed is None or not feed.finished or sub.cursor < feed.last:
            return None
        return feed.status
