"""Where a process hears the database's notifications: a small protocol, and a LISTEN of its own.

The hub depends only on `NotificationSource`, so a process that already holds one LISTEN
connection (the dispatcher's, or a shared listener) can feed it instead of `PgListener`
opening another. A callback receives the notification's payload, or None when
notifications may have been lost (the connection dropped and came back): the subscriber
then re-reads what it follows from the durable record.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

import psycopg

from ledgerloop.db import footprint, pooling

log = logging.getLogger(__name__)

#: A notification's payload, or None: "some may have been missed, re-read".
Callback = Callable[[str | None], None]


class NotificationSource(Protocol):
    def subscribe(self, channel: str, callback: Callback) -> Callable[[], None]:
        """Call `callback` (from any thread) for each notification on `channel` until the
        returned function is called."""
        ...


class PgListener:
    """One connection LISTENing on every channel subscribed to, in a thread of its own.

    Behind a transaction-mode pooler it LISTENs on the direct URL (db/pooling.py). With
    nowhere to LISTEN it tells every callback None every `poll_s`: the subscribers re-read,
    a statement per followed run, never one per client.
    """

    def __init__(self, url: str, *, poll_s: float = 1.0, reconnect_s: float = 1.0) -> None:
        self.listen_url = pooling.session_url(url)
        self.poll_s = poll_s
        self.reconnect_s = reconnect_s
        self._callbacks: dict[str, list[Callback]] = defaultdict(list)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._thread: threading.Thread | None = None
        #: Set once the connection LISTENs on every channel subscribed so far (tests wait).
        self.listening = threading.Event()

    def subscribe(self, channel: str, callback: Callback) -> Callable[[], None]:
        with self._lock:
            first = not self._callbacks[channel]
            self._callbacks[channel].append(callback)
            conn = self._conn
        if first and conn is not None:
            # On failure the thread reconnects and LISTENs on every channel.
            with contextlib.suppress(psycopg.Error):
                conn.execute(f"LISTEN {_ident(channel)}")
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="ledgerloop-stream-listen", daemon=True
            )
            self._thread.start()

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks[channel]:
                    self._callbacks[channel].remove(callback)

        return unsubscribe

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

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
            except Exception:  # a subscriber's bug must not stop the others' notifications
                log.exception("stream notification callback failed")

    def _run(self) -> None:
        if self.listen_url is None:
            while not self._stop.wait(self.poll_s):
                self._tell(None, None)
            return
        first = True
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self.listen_url,
                    autocommit=True,
                    application_name=footprint.application_name("stream-listen"),
                ) as conn:
                    with self._lock:
                        self._conn = conn
                        channels = [c for c, cbs in self._callbacks.items() if cbs]
                    for channel in channels:
                        conn.execute(f"LISTEN {_ident(channel)}")
                    self.listening.set()
                    if not first:
                        self._tell(None, None)  # what happened while disconnected
                    first = False
                    while not self._stop.is_set():
                        # The timeout only lets the thread see _stop: waiting sends nothing.
                        for notify in conn.notifies(timeout=0.5):
                            self._tell(notify.channel, notify.payload)
            except psycopg.Error as exc:
                self.listening.clear()
                log.warning("stream listener lost its connection (%s); reconnecting", exc)
                self._stop.wait(self.reconnect_s)
            finally:
                with self._lock:
                    self._conn = None


def _ident(channel: str) -> str:
    if not channel.replace("_", "").isalnum():
        raise ValueError(f"channel {channel!r} is not a plain identifier")
    return channel
