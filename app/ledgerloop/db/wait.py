"""Waiting for the database at start-up: a worker started during a failover comes up when
the database returns, instead of exiting."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

from ledgerloop.db.errors import DatabaseUnreachable, describe_target, translated
from ledgerloop.db.url import validate_url

#: First pause between attempts, and its cap; it doubles in between.
FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 5.0


def _try_connect(url: str) -> None:
    with translated(url, "connecting"):
        psycopg.connect(url, connect_timeout=5).close()


def wait_for_database(url: str, timeout_s: float, announce: Callable[[str], None] = print) -> None:
    """Return once the database accepts a connection; retry an unreachable one for up to
    `timeout_s` (announced once, not per attempt). Any other problem (a missing database,
    a refused role) is raised at once: waiting cannot fix it."""
    url = validate_url(url)
    deadline = time.monotonic() + timeout_s
    pause = FIRST_PAUSE_S
    announced = False
    while True:
        try:
            _try_connect(url)
        except DatabaseUnreachable as exc:
            if time.monotonic() + pause > deadline:
                raise DatabaseUnreachable(
                    f"{exc.message}; gave up after waiting {timeout_s:.0f} s",
                    fix=f"{exc.fix}; LEDGERLOOP_STARTUP_WAIT_S sets how long to wait",
                ) from exc
            if not announced:
                announce(
                    f"database {describe_target(url)} unreachable ({exc.message}); "
                    f"waiting up to {timeout_s:.0f} s for it (LEDGERLOOP_STARTUP_WAIT_S)"
                )
                announced = True
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)
            continue
        if announced:
            announce(f"database {describe_target(url)} reachable again")
        return
