"""Worker liveness: registration, heartbeats and the takeover of dead peers.

Each worker process start is a new identity (a random executor id). The heartbeat runs on a
thread and a connection of its own, never behind step work. Every tick is one statement
(queries.sql `executor_heartbeat`): this worker's heartbeat, then, if this worker has been
heartbeating without a gap for `stale_after_s`, the takeover of every dead peer in the same
short transaction. A worker that finds its own row gone was taken over while frozen or cut
off: it revokes its fence (ledgerloop.fleet.fence), so no execution of a run it lost starts
another step, and registers again.

Postgres's clock judges staleness; a worker's clock only times its own lease.

An idle worker rests: after `stale_after_s` with nothing to execute (holding its advisory
lock on a session of its own) it writes `resting_since` once (`executor_rest`), then nothing;
its lease is not renewed, and peers judge it by its session's lock alone. It watches its
peers read-only (its streak never breaks; every heartbeat while a peer heartbeats, which
notifies `ledgerloop_fleet`). A claim, step body or checkpoint asks the fence for a lease
(`Fence.want`), which wakes the thread: its next statement is a heartbeat again.

A database that went back in time: after a failover to a replica that lagged, the commits the
old primary had not shipped are gone, and this worker may hold in memory executions whose
last steps the database no longer has. A failed heartbeat suspends the fence (no step body,
claim or checkpoint); the heartbeat that lands again first runs the rewind check
(queries.sql `executor_rewound`): the last checkpoint of each workflow this worker executed
lately must still be in the journal. Those that are not, and the PENDING workflows under this
worker it no longer executes (a run whose end was lost), go back on the queue; the fence is
revoked, so every execution here checks its ownership before its next step, and those of the
workflows put back stop there. The next execution resumes each from the journal the database
now holds, through the fence as after a takeover. The check runs once more when its claim
grace has passed (claims younger than it were not judged), and after each the worker wakes its
message waits (notifications sent while DBOS's listener reconnected are lost).

Every connection the worker opens reads the server's timeline first (`observe_timeline`: its
pool's, DBOS's engine's, the relay's and reconciler's); one on another timeline than the
heartbeat's closes the fence and waits for the check. Each heartbeat records the timeline in
the worker's row, so a takeover of a worker that died with the old primary (it never ran the
check) marks its runs rewound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

import psycopg
from psycopg.rows import dict_row

from ledgerloop.db import footprint, pooling
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.fleet.fence import Fence
from ledgerloop.fleet.rewind import follow_rewind
from ledgerloop.fleet.timings import (
    CLAIM_GRACE_MS,
    DUE_MARGIN_S,
    FLEET_CHANNEL,
    LOCK_NAMESPACE,
    PUBLISH_EVERY_S,
    REST_WATCH_SHARE,
    SESSION_MARGIN_S,
    FleetTimings,
    Rewind,
    Takeover,
    software_version,
)
from ledgerloop.runs.store import run_executions_stopped

log = logging.getLogger(__name__)

Q = load_queries("ledgerloop.fleet")

# Defined in fleet.timings, imported from here by callers.
__all__ = [
    "LOCK_NAMESPACE",
    "SESSION_MARGIN_S",
    "FleetTimings",
    "Heartbeat",
    "Rewind",
    "Takeover",
    "software_version",
]


class Heartbeat:
    """Registers this worker, heartbeats on its own thread, takes dead peers over."""

    def __init__(
        self,
        url: str,
        executor_id: str,
        app_version: str,
        timings: FleetTimings,
        fence: Fence,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.executor_id = executor_id
        self.app_version = app_version
        self.timings = timings
        self.fence = fence
        self._clock = clock
        self._lock_key = random.randint(1, 2**31 - 1) if self.session_url else 0
        self._conn: Conn | None = None
        self._locked = False
        self._session_since: datetime | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledgerloop-heartbeat", daemon=True)
        self._unreachable_since: float | None = None
        self._ticks = 0
        #: Seconds from the last tick until a peer whose session is gone may be taken over.
        self._due_s: float | None = None
        #: Live peers at the last tick (heartbeating within the staleness limit); until the
        #: first tick, assume some: a burst is then shared as with peers.
        self.peers = 1
        #: Called with each takeover this worker made (tests and benchmarks listen here).
        self.on_takeover: Callable[[Takeover], None] | None = None
        #: After a failed heartbeat: the next connection first runs the rewind check.
        self._check_rewind = False
        self._timeline: int | None = None
        #: Called with what each rewind check that found something found (the worker drops
        #: its in-memory state for those runs there).
        self.on_rewind: Callable[[Rewind], None] | None = None
        #: Called after each rewind check (the database was away, or failed over): messages
        #: notified meanwhile were not heard (the worker wakes their waiters there).
        self.on_reconnect: Callable[[], None] | None = None
        #: When the follow-up of the last rewind check is due (see `_tick`).
        self._recheck_at: float | None = None
        # -- rest (see `may_rest`) --
        #: The row says this worker rests: it writes nothing, its lease is not renewed.
        self.resting = False
        #: The database's time of this worker's last statement that landed, and the start of
        #: its streak (executor_heartbeat).
        self._seen_at: datetime | None = None
        self._streak_since: datetime | None = None
        #: When this worker last had executions (this clock), and whether the next heartbeat
        #: tells resting peers it heartbeats.
        self._busy_at = self._clock()
        self._wake_peers = True
        #: Peers that heartbeat (may hold runs), at the last statement.
        self.beating = 1
        #: Until then (this clock), a resting worker watches every heartbeat: a peer woke.
        self._alert_until = 0.0
        self._watched_at = float("-inf")
        self._published: list[str] | None = None
        self._published_at = float("-inf")
        # A byte here wakes the thread from its rest: the fence wants a lease, or a stop.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        fence.on_want = self._poke

    # -- connection ----------------------------------------------------------------------

    @property
    def session_url(self) -> str | None:
        """The heartbeat's session holds an advisory lock, so it needs a session of its own:
        the direct URL behind a transaction-mode pooler. Without one (None) it heartbeats
        through the pooler, holds no lock (its row's lock_key is 0) and trusts no peer's free
        lock: peers then judge it, and it them, by stale_after_s alone."""
        return pooling.session_url(self.url)

    def _connection(self) -> Conn:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        timeout = max(1, int(self.timings.stale_after_s / 2))
        url = self.session_url or self.url
        conn: Conn = psycopg.connect(
            url,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=timeout,
            application_name=footprint.application_name("heartbeat"),
            **pooling.connect_kwargs(url),
        )
        self._session_since = None
        if self.session_url is not None:
            # A session of its own: its settings concern no one else.
            ms = self._timeout_ms()
            conn.execute(f"SET statement_timeout = {ms}; SET lock_timeout = {ms}")
            # When this session began, by the database's clock: a peer's free lock is
            # evidence of its death only if its last heartbeat came later (queries.sql,
            # executor_heartbeat). Through a pooler there is no such session: None trusts
            # no free lock.
            row = conn.execute("SELECT now() AS since").fetchone()
            self._session_since = row["since"] if row else None
            # A resting worker hears here when a peer starts heartbeating.
            conn.execute(f"LISTEN {FLEET_CHANNEL}")
        self._conn, self._locked = conn, False
        return conn

    def _read_timeline(self, conn: Conn) -> int | None:
        try:
            with self._bounded(conn), conn.transaction():
                row = conn.execute(Q["executor_timeline"]).fetchone()
        except psycopg.errors.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                raise
            return None
        return None if row is None or row["timeline"] is None else int(row["timeline"])

    def _timeout_ms(self) -> int:
        # A tick never waits long on a lock or a slow statement: the next tick retries.
        return int(self.timings.stale_after_s * 1000 / 4)

    @contextmanager
    def _bounded(self, conn: Conn) -> Iterator[Conn]:
        """The tick's statements under its timeouts. Through a pooler, the timeouts are set
        for the tick's transaction only (set_config(..., true)): a session SET would stay on
        the server connection for the pooler's next client."""
        if self.session_url is not None:
            yield conn
            return
        ms = str(self._timeout_ms())
        with conn.transaction():
            conn.execute(
                "SELECT set_config('statement_timeout', %s, true), "
                "set_config('lock_timeout', %s, true)",
                (ms, ms),
            )
            yield conn

    def _take_lock(self, conn: Conn) -> None:
        # Held for the life of this session: when the process dies, Postgres drops the
        # session and the lock with it, and peers see that before the heartbeat goes stale.
        # Not holding it (another session still holds this key) only slows detection.
        # Through a pooler without a direct URL it would stay on a pooled server connection:
        # no lock then (lock_key 0).
        if not self._locked and self._lock_key:
            row = conn.execute(
                Q["executor_lock"], {"lock_ns": LOCK_NAMESPACE, "lock_key": self._lock_key}
            ).fetchone()
            self._locked = bool(row and row["locked"])

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                log.debug("closing the heartbeat connection failed", exc_info=True)
        self._conn, self._locked = None, False

    # -- registration --------------------------------------------------------------------

    def register(self) -> None:
        """Insert this worker's row (before DBOS launches, so it can never look dead)."""
        conn = self._connection()
        self._take_lock(conn)
        if self._timeline is None:
            self._timeline = self._read_timeline(conn)
        sent = self._clock()
        with self._bounded(conn):
            conn.execute(
                Q["executor_register"],
                {
                    "id": self.executor_id,
                    "app_version": self.app_version,
                    "hostname": socket.gethostname(),
                    "pid": os.getpid(),
                    "lock_key": self._lock_key,
                    "software_version": software_version(),
                    "my_lease_s": self.timings.lease_s,
                    "timeline": self._timeline,
                },
            )
        self.fence.renew(sent, self.timings.lease_s)
        self.resting = self.fence.resting = False
        self._busy_at = self._clock()
        self._wake_peers = True
        self._published = None

    def unregister(self) -> int:
        """A clean stop: hand this worker's runs back to the queue, remove its row."""
        self._stop.set()
        self._poke()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timings.stale_after_s)
        conn = self._connection()
        with conn.transaction():
            # Their execution spans ended with the stop: the next execution must not
            # rebuild them.
            run_executions_stopped(conn, self.executor_id)
            row = conn.execute(Q["executor_unregister"], {"id": self.executor_id}).fetchone()
        self._drop_connection()
        return int(row["runs"]) if row else 0

    # -- the thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._poke()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timings.stale_after_s)
        self._drop_connection()

    def _run(self) -> None:
        next_at = self._clock()
        while not self._stop.is_set():
            self.tick()
            if self.resting:
                self._rest()
                next_at = self._clock()
                continue
            # Counted from the tick's answer, so never before the database's moment.
            due_at = None if self._due_s is None else self._clock() + self._due_s
            if due_at is not None and due_at < next_at + self.interval_s():
                # A peer's session is gone: tick again just after its lease runs out (the
                # earliest moment it may be taken over), not at the next regular heartbeat.
                # The regular schedule is kept.
                self._stop.wait(max(0.0, due_at - self._clock()))
                continue
            next_at += self.interval_s()
            now = self._clock()
            if next_at < now:  # frozen or starved: no burst of catch-up ticks
                next_at = now
            self._stop.wait(next_at - now)

    # -- rest ------------------------------------------------------------------------------

    def _poke(self) -> None:
        """Wake the thread from its rest (the fence wants a lease, or the worker stops)."""
        # A byte may be waiting already (the pipe is full): one is enough.
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")

    def may_rest(self) -> bool:
        """Whether this worker may stop heartbeating: nothing executed or wanted a lease for
        `stale_after_s`, and it holds its lock on a session of its own (not via a pooler)."""
        return (
            self.session_url is not None
            and self._locked
            and not self.busy()
            and not self.fence.wanted
            and not self._check_rewind
            and self._unreachable_since is None
            and self._clock() - self._busy_at >= self.timings.stale_after_s
        )

    def _should_watch_s(self) -> float:
        """How long a resting worker may wait before it looks at its peers again."""
        if self._due_s is not None:
            return self._due_s
        if self.beating or self._clock() < self._alert_until:
            return self.timings.heartbeat_s
        return self.timings.gap_s * REST_WATCH_SHARE

    def _rest(self) -> None:
        """Wait until a watch is due, a peer starts heartbeating (notified), the fence wants
        a lease, the worker stops, or the server closes the connection."""
        conn = self._conn
        deadline = self._clock() + self._should_watch_s()
        while not self._stop.is_set() and not self.fence.wanted and not self.busy():
            if conn is None or conn.closed:
                return
            try:
                if list(conn.notifies(timeout=0)):  # a peer started heartbeating
                    self._alert_until = self._clock() + self.timings.stale_after_s
                    return
            except psycopg.Error:
                return
            left = deadline - self._clock()
            if left <= 0:
                return
            try:
                ready, _, _ = select.select([conn.fileno(), self._wake_r], [], [], min(left, 1.0))
            except (OSError, ValueError, psycopg.Error):
                return
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 64)

    def busy(self) -> bool:
        return bool(self.fence.executions)  # whether it executes runs (a length: no lock)

    def interval_s(self) -> float:
        return self.timings.busy_heartbeat_s if self.busy() else self.timings.heartbeat_s

    def tick(self) -> list[Takeover]:
        """One heartbeat (and takeover of dead peers). Never raises; returns the takeovers."""
        self._due_s = None
        try:
            takeovers = self._tick()
        except psycopg.Error as exc:
            self._drop_connection()
            self.resting = self.fence.resting = False
            # The server this worker's lease came from may be gone, and the one that follows
            # may not hold what this worker recorded: nothing runs until the check.
            self.fence.suspend()
            self._check_rewind = True
            if self._unreachable_since is None:
                self._unreachable_since = self._clock()
                log.warning(
                    "heartbeat failed (%s); runs pause at their next step until it lands",
                    " ".join(str(exc).split()),
                )
            return []
        if self._unreachable_since is not None:
            log.info("heartbeat landed again after %.1f s", self._clock() - self._unreachable_since)
            self._unreachable_since = None
        return takeovers

    def _tick(self) -> list[Takeover]:
        conn = self._connection()
        if self._check_rewind:
            self.rewind_check(conn)
            self._check_rewind = False
            # Claims younger than the grace were not judged: judge them once it has passed.
            self._recheck_at = self._clock() + CLAIM_GRACE_MS / 1000
            self._reconnected()
        elif self._recheck_at is not None and self._clock() >= self._recheck_at:
            self._recheck_at = None
            self.rewind_check(conn)
            self._reconnected()
        self._take_lock(conn)
        if not self._locked or self.busy() or self.fence.wanted:
            self.resting = self.fence.resting = False
        if self.busy() or self.fence.wanted:
            self._busy_at = self._clock()
        watch = self.resting
        self._ticks += 1
        lease_s = self.timings.busy_lease_s if self.busy() else self.timings.lease_s
        wanted = self.fence.wanted
        sent = self._clock()
        with self._bounded(conn):
            rows = conn.execute(
                Q["executor_heartbeat"],
                {
                    "id": self.executor_id,
                    "session_since": self._session_since,
                    "my_lease_s": lease_s,
                    "timeline": self._timeline,
                    "watch": watch,
                    "wake": self._wake_peers and not watch,
                    "seen_at": self._seen_at,
                    "streak_since": self._streak_since,
                    **self.timings.params(),
                },
            ).fetchall()
        mine, others = rows[0], rows[1:]
        self.peers = int(mine["peers"])
        if mine["rewound"]:
            log.warning(
                "%d runs taken over from workers that last heartbeat before a failover were "
                "marked rewound: their writes are found again by their key before any send",
                mine["rewound"],
            )
        self.beating = int(mine["beating"])
        self._seen_at, self._streak_since = mine["db_now"], mine["streak_since"]
        if watch:
            self._watched_at = self._clock()
        due = mine["due_s"]
        # A little past the moment (the database's clock too); never a busy loop.
        self._due_s = None if due is None else max(float(due), 0.0) + DUE_MARGIN_S
        if not mine["alive"]:
            self._taken_over(conn)
        elif not watch:
            self._wake_peers = False
            self.fence.renew(sent, lease_s)
            if wanted:
                self.fence.want_served()
        takeovers = [
            Takeover(r["id"], r["hostname"], float(r["silent_s"]), int(r["runs"])) for r in others
        ]
        for takeover in takeovers:
            log.info(
                "took over worker %s on %s (silent %.1f s): %d runs back on the queue",
                takeover.executor_id,
                takeover.hostname,
                takeover.silent_s,
                takeover.runs,
            )
            if self.on_takeover:
                self.on_takeover(takeover)
        if not self.resting:
            self._publish(conn)
            list(conn.notifies(timeout=0))  # heard while awake: nothing to do, let go
        # Orphans (PENDING under a worker with no row) are rare; look every 30 s of
        # heartbeats (less often at rest, when ticks are watches far apart).
        if self._ticks % max(1, int(30 / self.timings.heartbeat_s)) == 0:
            with self._bounded(conn):
                swept = conn.execute(
                    Q["executor_sweep_orphans"],
                    {"id": self.executor_id, "stale_s": self.timings.stale_after_s},
                ).fetchall()
            if swept:
                log.info(
                    "put %d runs of workers that are gone back on the queue (workers: %s)",
                    len(swept),
                    ", ".join(sorted({r["executor_id"] for r in swept})),
                )
        if mine["alive"] and not self.resting and self.may_rest():
            self._rest_now(conn)
        return takeovers

    @property
    def timeline(self) -> int | None:
        """The server's timeline as of the last check (None: unknown)."""
        return self._timeline

    def _rest_now(self, conn: Conn) -> None:
        # No claim commits meanwhile (the dispatcher claims under this lock).
        with self.fence.claim_lock:
            row = conn.execute(Q["executor_rest"], {"id": self.executor_id}).fetchone()
            if row is None:  # something is PENDING here (or the row is gone): not now
                self._busy_at = self._clock()
                return
            self.fence.rest()
        self._seen_at = row["db_now"]
        self.resting = True
        self._published, self._published_at = [], self._clock()

    def _publish(self, conn: Conn) -> None:
        """What it executes (`runs stuck`): on a change, and every PUBLISH_EVERY_S if any."""
        running = sorted(self.fence.running)
        recent = self._clock() - self._published_at < PUBLISH_EVERY_S
        if running == self._published and (not running or recent):
            return
        with self._bounded(conn):
            conn.execute(Q["executor_executing"], {"id": self.executor_id, "running": running})
        self._published, self._published_at = running, self._clock()

    def observe(self, conn: Conn) -> None:
        """A new connection of this worker's pools: when it reaches another timeline than the
        heartbeat's (a promoted standby), close the fence now, before the heartbeat's own
        connection fails, and have the next tick run the rewind check. Never raises; leaves
        `conn` idle."""
        if self._timeline is None:
            return
        try:
            with conn.transaction():
                row = conn.execute(Q["executor_timeline"]).fetchone()
        except psycopg.Error:
            return
        self.observe_timeline(None if row is None else row["timeline"])

    def observe_timeline(self, timeline: int | None) -> bool:
        """A connection (of any kind: this worker's pools, DBOS's engine, the relay's) reached
        `timeline`. Another than the heartbeat's: the database failed over; the fence closes
        until the rewind check has run. Returns whether a rewind check is pending (the caller
        then waits for it before its first statement: `Fence.wait_valid`)."""
        known = self._timeline
        if known is None or timeline is None or int(timeline) == known:
            return self._check_rewind
        if not self._check_rewind:
            self.fence.suspend()
            self._check_rewind = True
            log.warning(
                "a connection reached timeline %s (the heartbeat's: %s): the database failed "
                "over; steps wait for the rewind check",
                timeline,
                known,
            )
        return True

    def rewind_check(self, conn: Conn) -> Rewind:
        """Did the database go back in time under this worker? Puts back on the queue what it
        lost (see the module's docstring) and revokes the fence when the server changed or
        anything was lost (fleet/rewind.py)."""
        before = self._timeline
        after = self._read_timeline(conn)
        self._timeline = after if after is not None else before
        with self._bounded(conn):
            rewind = follow_rewind(conn, self.executor_id, self.fence, before, after)
        if (rewind.lost or rewind.moved) and self.on_rewind:
            self.on_rewind(rewind)
        return rewind

    def _reconnected(self) -> None:
        if self.on_reconnect is not None:
            try:
                self.on_reconnect()
            except Exception:
                log.warning("waking message waiters after a reconnection failed", exc_info=True)

    def _taken_over(self, conn: Conn) -> None:
        # Our row is gone: a peer judged us dead (we were frozen, starved or cut off past
        # stale_after_s) and put our runs back on the queue. Revoke first, so no execution
        # of a lost run starts a step, then come back as a live worker.
        self.fence.revoke()
        self.resting = self.fence.resting = False
        log.warning(
            "this worker %s was taken over by a peer after a silence; its runs went back "
            "on the queue, registering again",
            self.executor_id,
        )
        self.register()
