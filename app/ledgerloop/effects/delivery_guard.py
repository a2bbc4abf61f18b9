"""Whether the relay may send a claimed call now: inside a worker, its fence decides.

A worker following a failover must not deliver from a claim the database may have lost
(fleet/guard.py, worker.py set the guard); a standalone relay has none.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

#: Asked before each send (inside a worker: its fence; see `guard_deliveries`).
DeliveryGuard = Callable[[int | None], Awaitable[bool]]
_guard: DeliveryGuard | None = None


def guard_deliveries(guard: DeliveryGuard | None) -> None:
    """Await `guard(timeline)` before each call this process's relays send (None: none).
    `timeline`: the server's timeline the claim's connection was on (None: unknown, or the
    act step's own record). False: not sent; the effect stays `started` and settles after
    its lease like any lost attempt (found again by its key). Inside a worker the guard
    waits while a failover's rewind check is pending, then refuses a claim made on another
    timeline than the database's now (a claim the database may have lost) and a send of an
    execution whose run the check sent back to the journal."""
    global _guard
    _guard = guard


class NotSent(Exception):
    """The delivery guard refused a send."""


async def check_send(key: str, timeline: int | None) -> None:
    """Raise NotSent when the guard refuses the send of `key` claimed on `timeline`."""
    guard = _guard
    if guard is not None and not await guard(timeline):
        log.warning(
            "relay did not send %s: its claim was made before a failover the worker is "
            "following; it settles after its lease, found again by its key",
            key,
        )
        raise NotSent(key)
