"""Dispatch: workers wake on LISTEN/NOTIFY when a run is queued, and poll only as a fallback.

Every run that becomes ENQUEUED on Ledgerloop's queue sends `NOTIFY ledgerloop_runs` on
commit (a trigger, migration 0016: runs started from SQL or HTTP, woken from hibernation,
handed back by a takeover or a clean stop). Each worker's dispatcher thread LISTENs on a
connection of its own; on a notification it claims ENQUEUED runs in small batches
(`FOR UPDATE SKIP LOCKED`, DBOS's own claim) until a batch comes back short. Idle workers
woken together take turns batch by batch, so a burst spreads across them instead of going
to whichever worker polled first. Without notifications (a lost connection, a pooler that
drops them) the dispatcher claims every `fallback_s` anyway.

DBOS's own queue thread does not listen to this queue (`DBOS.listen_queues`): it would poll
it 20 times a second and claim a whole burst at once.

Behind a transaction-mode pooler (db/pooling.py) the dispatcher LISTENs on the direct URL,
and there it also relays DBOS's message notifications to DBOS's waiters (DBOS runs without
LISTEN then: its own listener would LISTEN through the pooler and hear nothing). With no
direct URL it cannot LISTEN at all: it claims every `poll_s` on a pooled connection.

Its connection is the process's one LISTEN connection (db/footprint.py): it also LISTENs on
DBOS's channels for DBOS (whose own listener is off, fleet/dbos_internals.py
`share_dbos_listener`) and on the channels other parts subscribe to (`subscribe`: the
relay's outbox, the HTTP server's run events), and calls their callbacks from its thread.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from ledgerloop.db import footprint, pooling
from ledgerloop.db.sql import load_queries
from ledgerloop.fleet import dbos_internals
from ledgerloop.fleet.fence import Fence

log = logging.getLogger(__name__)

Q = load_queries("ledgerloop.fleet")

CHANNEL = "ledgerloop_runs"

#: How long a claim waits for a resting worker's heartbeat (see drain).
WAKE_WAIT_S = 1.0

#: The pause after a full batch before claiming the next one (see drain).
BATCH_PAUSE_S = 0.005


class Dispatcher:
    def __init__(
        self,
        url: str,
        queue: Any,
        fence: Fence,
        *,
        batch: int = 8,
        fallback_s: float = 10.0,
        peers: Callable[[], int] = lambda: 1,
        listen_url: str | None = "",
        poll_s: float = 1.0,
        relay_dbos_notifications: bool = False,
        channels: Iterable[str] = (),
    ) -> None:
        """`relay_dbos_notifications`: LISTEN on DBOS's channels and forward what arrives to
        DBOS's waiters (DBOS runs without a listener of its own). `channels`: channels others
        will `subscribe` to, LISTENed on from the start (one subscribed later is LISTENed on
        at the thread's next wake-up)."""
        self.url = url
        #: Where it LISTENs and claims; None: nowhere to LISTEN (it polls every poll_s).
        # Default: the route registered for `url` (its direct URL behind a pooler).
        self.listen_url = pooling.session_url(url) if listen_url == "" else listen_url
        self.relay_dbos_notifications = relay_dbos_notifications and self.listen_url is not None
        #: How many live peers could take a batch this worker leaves (the heartbeat knows).
        self.peers = peers
        self.queue = queue
        self.fence = fence
        self.batch = batch
        self.fallback_s = fallback_s if self.listen_url is not None else min(fallback_s, poll_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledgerloop-dispatch", daemon=True)
        self._conn: psycopg.Connection[Any] | None = None
        #: Subscribers by channel (`subscribe`), and the channels the connection LISTENs on.
        self._callbacks: dict[str, list[Callable[[str | None], None]]] = defaultdict(list)
        self._channels: set[str] = set(channels)
        self._listening: set[str] = set()
        self._lock = threading.Lock()
        # This dispatcher's own channel: stop() notifies it, so the thread can sleep until a
        # run or the fallback is due instead of waking every half second to look at _stop.
        self._wake = f"ledgerloop_dispatch_{uuid.uuid4().hex}"
        #: Runs this process claimed, and the most one claim took (tests and benchmarks read
        #: them).
        self.claimed = 0
        self.largest_claim = 0

    def start(self) -> None:
        self._thread.start()

    def subscribe(self, channel: str, callback: Callable[[str | None], None]) -> Callable[[], None]:
        """Call `callback` (from the dispatcher's thread) with each notification's payload on
        `channel`, and with None after the connection came back (notifications sent meanwhile
        are lost: re-read), until the returned function is called. Callbacks must be quick
        and must not block: claims wait behind them. streams.source.NotificationSource."""
        if not channel.replace("_", "").isalnum():
            raise ValueError(f"channel {channel!r} is not a plain identifier")
        with self._lock:
            self._callbacks[channel].append(callback)
            new = channel not in self._channels
            self._channels.add(channel)
        if new and self._thread.is_alive() and self.listen_url is not None:
            # The thread may sleep in its wait for seconds: wake it to LISTEN (once per
            # channel per process; `ledgerloop up` names its channels up front instead).
            threading.Thread(target=self._nudge, name="ledgerloop-dispatch-nudge").start()

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks[channel]:
                    self._callbacks[channel].remove(callback)

        return unsubscribe

    def _tell(self, channel: str | None, payload: str | None) -> None:
        with self._lock:
            targets = [
                cb
                for name, callbacks in self._callbacks.items()
                if channel is None or name == channel
                for cb in callbacks
            ]
        for callback in targets:
            try:
                callback(payload)
            except Exception:  # a subscriber's bug must not stop dispatch
                log.exception("notification callback on %s failed", channel)

    def _listen_more(self, conn: psycopg.Connection[Any]) -> None:
        """LISTEN on channels subscribed since the connection was made."""
        with self._lock:
            new = self._channels - self._listening
        for channel in sorted(new):
            conn.execute(f"LISTEN {channel}")
            self._listening.add(channel)

    def _nudge(self) -> None:
        """Wake the thread from its wait (on a short connection: the process's spare)."""
        assert self.listen_url is not None
        try:
            with psycopg.connect(
                self.listen_url,
                autocommit=True,
                connect_timeout=2,
                application_name=footprint.application_name("spare"),
            ) as conn:
                conn.execute("SELECT pg_notify(%s, '')", (self._wake,))
        except psycopg.Error:
            pass  # the database is gone: the thread is already failing, waiting on _stop

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self.listen_url is not None:
            self._nudge()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _listen(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            if self.listen_url is None:
                # Through the pooler: no LISTEN, and no prepared statements.
                conn = psycopg.connect(
                    self.url,
                    autocommit=True,
                    application_name=footprint.application_name("listener"),
                    **pooling.connect_kwargs(self.url),
                )
            else:
                conn = psycopg.connect(
                    self.listen_url,
                    autocommit=True,
                    application_name=footprint.application_name("listener"),
                )
                conn.execute(f"LISTEN {CHANNEL}")
                conn.execute(f"LISTEN {self._wake}")
                if self.relay_dbos_notifications:
                    for channel in dbos_internals.DBOS_CHANNELS:
                        conn.execute(f"LISTEN {channel}")
                self._listening = set()
                self._listen_more(conn)
            self._conn = conn
            # Subscribers re-read what they follow: notifications sent while nobody
            # listened (before this connection, or while it was down) are gone.
            self._tell(None, None)
        return self._conn

    def _wait(self, conn: psycopg.Connection[Any], wait: float) -> bool:
        """Sleep until a run is queued (True), the wait is over or a stop; relay DBOS's
        message notifications that arrive meanwhile."""
        if self.listen_url is None:
            # Nowhere to LISTEN: subscribers re-read every poll instead (as PgListener does).
            self._stop.wait(wait)
            self._tell(None, None)
            return False
        deadline = time.monotonic() + wait
        while True:
            # A channel subscribed meanwhile: `subscribe` woke this thread to LISTEN on it.
            self._listen_more(conn)
            left = max(0.0, deadline - time.monotonic())
            for notify in conn.notifies(timeout=left):
                if notify.channel == CHANNEL:
                    return True
                if notify.channel == self._wake:
                    if self._stop.is_set():
                        return True
                    break
                if notify.channel in dbos_internals.DBOS_CHANNELS:
                    dbos_internals.forward_dbos_notification(notify.channel, notify.payload)
                else:
                    self._tell(notify.channel, notify.payload)
            if time.monotonic() >= deadline:
                return False

    def _run(self) -> None:
        failing_since: float | None = None
        last_claim = 0.0
        # Claim at once at start and after (re)connecting: notifications sent while nobody
        # listened are gone. Also again soon when a drain stopped at the fence.
        owed = True
        while not self._stop.is_set():
            try:
                conn = self._listen()
                woken = owed
                if not woken:
                    wait = max(0.0, last_claim + self.fallback_s - time.monotonic())
                    woken = self._wait(conn, wait)
                    woken = woken or time.monotonic() >= last_claim + self.fallback_s
                if woken and not self._stop.is_set():
                    owed = not self.drain()
                    last_claim = time.monotonic()
                    if owed:
                        self._stop.wait(0.05)
                if failing_since is not None:
                    down_s = time.monotonic() - failing_since
                    log.info("dispatch listening again after %.1f s", down_s)
                    failing_since = None
            except Exception as exc:
                if self._conn is not None:
                    self._conn.close()
                self._conn, owed = None, True
                if failing_since is None:
                    failing_since = time.monotonic()
                    log.warning("dispatch failed (%s); retrying", " ".join(str(exc).split()))
                self._stop.wait(min(1.0, self.fallback_s))
        if self._conn is not None:
            self._conn.close()

    def _work_waiting(self) -> bool:
        """Whether Ledgerloop's queue holds a run a claim could take (a read: a resting
        worker asks before it heartbeats again, so its fallback poll writes nothing)."""
        row = self._listen().execute(Q["queue_waiting"], {"queue": self.queue.name}).fetchone()
        return bool(row and row[0])

    def pause_s(self) -> float:
        """The pause after a full batch: BATCH_PAUSE_S per batch this worker already runs;
        none for a worker alone, which no one else would take the next batch from (with the
        pause, a lone worker started a burst of 1,000 runs at 25 runs/s)."""
        if self.peers() == 0:
            return 0.0
        running = dbos_internals.running_on_queue(self.queue.name) + dbos_internals.starting()
        return BATCH_PAUSE_S * max(1.0, running / self.batch)

    def drain(self) -> bool:
        """Claim and start queued runs, a batch at a time, until a batch comes back short.
        False if it stopped early (the fence is down): the caller tries again soon."""
        while not self._stop.is_set():
            # Under the fence's claim lock: the heartbeat takes it to rest, so a claim is
            # never committed under a row that says this worker rests (it would be judged
            # by its lock alone, and a freeze would keep its runs).
            with self.fence.claim_lock:
                valid = self.fence.valid()
                if valid:
                    # On the listening connection: the claim is one statement there
                    # (dbos_internals).
                    claimed = dbos_internals.claim_batch(self.queue, self.batch, self._listen())
            if not valid:
                # Resting (no lease, to write nothing while idle): heartbeat first, when
                # there may be work, so the claimed runs start their steps at once.
                # Presumed dead or about to be: claiming now would hand runs to a worker
                # that may not run steps.
                if self.fence.resting and not self._work_waiting():
                    return True
                if not self.fence.wait_valid(WAKE_WAIT_S):
                    return False
                continue
            if claimed.statuses:
                self.fence.verified(claimed.owner)
                dbos_internals.start_claimed(claimed)
                self.claimed += len(claimed.statuses)
                self.largest_claim = max(self.largest_claim, len(claimed.statuses))
            if len(claimed.statuses) < self.batch:
                return True
            # Let the other woken workers take the next batch if they are ready first: a
            # claim takes about a millisecond, less than a peer needs to wake up. The more
            # this worker already runs, the longer it leaves them (a busy peer wakes later),
            # so a takeover's runs spread over the survivors by their load.
            pause = self.pause_s()
            if pause:
                time.sleep(pause)
        return True
