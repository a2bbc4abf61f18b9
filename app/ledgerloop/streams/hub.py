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
from ledgerloop.streams.feed import Page, StreamEvent
from ledgerloop.streams.source import NotificationSource

log = logging.getLogger(__name__)

#: Where the run event trigger (migration 0026) notifies: `run_id:sequence`.
CHANNEL = "ledgerloop_run_events"

#: How many recent events a feed keeps for subscribers catching up.
BUFFER = 256

#: Reads a run's record after a sequence (as the owner: a subscription was authorized when
#: it began).
Reader = Callable[[uuid.UUID, int], Awaitable[Page | None]]


@dataclass(eq=False)  # each subscription is its own (hashed by identity)
class Subscription:
    run_id: uuid.UUID
    #: The last durable sequence this subscriber has sent.
    cursor: int
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Feed:
    last: int
    status: RunStatus | None = None
    buffer: deque[StreamEvent] = field(default_factory=lambda: deque(maxlen=BUFFER))
    subscribers: set[Subscription] = field(default_factory=set)
    reading: asyncio.Task[None] | None = None
    again: bool = False

    @property
    def finished(self) -> bool:
        return self.status is not None and self.status in TERMINAL


class RunEventHub:
    def __init__(self, source: NotificationSource, read: Reader) -> None:
        self.source = source
        self.read = read
        self._feeds: dict[uuid.UUID, _Feed] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe: Callable[[], None] | None = None
        #: Reads of the record the feeds made (tests and the benchmark look).
        self.reads = 0

    def start(self) -> None:
        """Subscribe to the source (on the loop the hub serves)."""
        self._loop = asyncio.get_running_loop()
        self._unsubscribe = self.source.subscribe(CHANNEL, self._notified)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        for feed in self._feeds.values():
            if feed.reading is not None:
                feed.reading.cancel()

    @property
    def subscribers(self) -> int:
        return sum(len(feed.subscribers) for feed in self._feeds.values())

    # -- notifications (the source's thread) ------------------------------------------------

    def _notified(self, payload: str | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_notification, payload)

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
            if feed.reading is not None:
                feed.reading.cancel()
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
