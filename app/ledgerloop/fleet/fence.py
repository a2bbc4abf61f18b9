"""The fence: a worker starts a step body only while it knows it is not presumed dead.

Peers take a worker's runs over once its heartbeat is older than `stale_after_s` by the
database's clock (sooner, but never before its lease has run out, when its heartbeat session
is gone). Each successful heartbeat gives this worker a lease (the one the heartbeat wrote
into its row: shorter while it executes runs) counted from the moment the heartbeat was
*sent* (by this process's monotonic clock, which keeps counting while the
process is frozen). The lease is shorter than any takeover condition, so a worker that has
been frozen, cut off or starved is past its lease before a peer may take its runs, and it
stops before a step body, not after.

The fast path is one comparison. Past the lease (rare: a stall or an outage) a step body
waits for the heartbeat thread to settle the question, then checks in the database that its
execution still owns its workflow. Once this worker has been taken over (its row was gone),
every execution it had must pass that check once before its next step body: those of the
runs it lost stop there. Stopping raises DBOS's own "no longer owned by this execution"
exception, so DBOS records nothing for the step and parks that execution.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from ledgerloop.errors import LedgerloopError


class FenceClosed(LedgerloopError):
    """The worker has stopped; a step body that waited for the fence will not start here."""


class Fence:
    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s
        self._clock = clock
        self._lease_until = float("-inf")
        self._closed = False
        self._released = False
        #: Step bodies under way (a stopping worker waits for them).
        self.active = 0
        #: The workflow executions running here (a stopping worker ends them between steps).
        self.executions: set[asyncio.Task[Any]] = set()
        #: The same executions by workflow id (the rewind check compares them with the
        #: workflows the database says this worker executes).
        self.running: dict[str, asyncio.Task[Any]] = {}
        #: Their ownership tokens, by workflow id.
        self.owners: dict[str, str] = {}
        #: Tokens of executions whose run a failover sent back to the journal: their
        #: statements are refused (`refuse_stale`), even those of a step body under way.
        self.stale: set[str] = set()
        #: Bumped at each takeover of this worker; executions verified since, by owner token.
        self.generation = 0
        self._verified: set[str] = set()
        self._cond = threading.Condition()
        #: Set by the heartbeat while its worker rests (it renews no lease): a step body,
        #: claim or checkpoint that finds the lease run out asks for one (`want`).
        self.resting = False
        #: Something waits for a lease; the heartbeat's next statement is a heartbeat.
        self.wanted = False
        #: Called by `want` (the heartbeat wakes from its rest).
        self.on_want: Callable[[], None] | None = None
        #: Held by a claim from the queue, and by the heartbeat while it goes to rest.
        self.claim_lock = threading.Lock()

    # -- written by the heartbeat thread --------------------------------------------------

    def renew(self, sent_at: float, lease_s: float | None = None) -> None:
        """A heartbeat sent at `sent_at` (this clock) landed and granted `lease_s` (the lease
        its row now records; `self.lease_s` by default); this worker's row is live."""
        lease = self.lease_s if lease_s is None else lease_s
        with self._cond:
            self._lease_until = max(self._lease_until, sent_at + lease)
            self._cond.notify_all()

    def want(self) -> None:
        """Ask the heartbeat for a lease now (it may be resting)."""
        if not self.wanted:
            self.wanted = True
            if self.on_want is not None:
                self.on_want()

    def rest(self) -> None:
        """The heartbeat rests: the lease ends now (call with `claim_lock` held)."""
        with self._cond:
            self._lease_until = float("-inf")
            self.resting = True
            self._cond.notify_all()

    def want_served(self) -> None:
        """A heartbeat landed and renewed the lease."""
        self.wanted = False

    def suspend(self) -> None:
        """A heartbeat failed: no step body, claim or checkpoint until one lands again (the
        lease this worker holds may be on a server that is gone, and the one that follows
        it may have lost what this worker recorded)."""
        with self._cond:
            self._lease_until = float("-inf")
            self._cond.notify_all()

    def revoke(self) -> None:
        """This worker was taken over: every execution must check its ownership again."""
        with self._cond:
            self._lease_until = float("-inf")
            self.generation += 1
            self._verified = set()
            self._cond.notify_all()

    def close(self) -> None:
        """A stopping worker: bodies under way finish, new ones wait."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def release(self) -> None:
        """The worker has stopped: bodies still waiting give up (FenceClosed)."""
        with self._cond:
            self._closed = self._released = True
            self._cond.notify_all()

    def enter(self) -> None:
        with self._cond:
            self.active += 1

    def leave(self) -> None:
        with self._cond:
            self.active -= 1

    # -- read before every step body ------------------------------------------------------

    def valid(self) -> bool:
        return not self._closed and self._clock() < self._lease_until

    def trusted(self, owner: str | None) -> bool:
        """May the execution holding `owner` start a step body without asking the database?"""
        if not self.valid():
            return False
        return self.generation == 0 or (owner is not None and owner in self._verified)

    def verified(self, owner: str | None) -> None:
        """The database confirmed that `owner` still owns its workflow (or just claimed it)."""
        if owner is None or self.generation == 0:
            return
        with self._cond:
            if len(self._verified) > 100_000:  # bounded; a forgotten token is checked again
                self._verified = set()
            self._verified.add(owner)

    def remaining_s(self) -> float:
        return self._lease_until - self._clock()

    def wait_renewed(self, poll_s: float = 0.05) -> None:
        """Block until the lease is valid again; FenceClosed once the worker has stopped."""
        if not self.valid():
            self.want()
        with self._cond:
            while not self.valid():
                if self._released:
                    raise FenceClosed()
                self._cond.wait(poll_s)

    def wait_valid(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Block until the lease holds, at most `timeout_s`; whether it does."""
        if self._clock() < self._lease_until:
            return True
        self.want()
        deadline = self._clock() + timeout_s
        with self._cond:
            # The lease alone: a stopping worker (closed) still records the steps under way.
            while not self._clock() < self._lease_until:
                left = deadline - self._clock()
                if left <= 0 or self._released:
                    return False
                self._cond.wait(min(poll_s, left))
        return True

    async def wait_valid_async(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """`wait_valid` on the event loop."""
        deadline = self._clock() + timeout_s
        while not self._clock() < self._lease_until:
            if self._clock() >= deadline or self._released:
                return False
            await asyncio.sleep(poll_s)
        return True

    async def wait_renewed_async(self, poll_s: float = 0.05) -> None:
        if not self.valid():
            self.want()
        while not self.valid():
            if self._released:
                raise FenceClosed()
            await asyncio.sleep(poll_s)
