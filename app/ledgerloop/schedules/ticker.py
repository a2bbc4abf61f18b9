"""Keeping a worker's schedules: wake at each tick, let the database pick the worker that
makes its run.

Every worker that declares a schedule wakes at its ticks; each asks the schedule's row
(schedules/store.py) and one of them, the one that locks it, makes the run. A worker that
finds the row locked asks again a moment later, so a worker killed while holding it (its
transaction rolled back) delays the tick's run by that moment, and never loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from psycopg_pool import ConnectionPool

from ledgerloop.db.connect import Conn
from ledgerloop.errors import ConfigError
from ledgerloop.schedules.definition import Schedule
from ledgerloop.schedules.store import schedule_declare, schedule_fire

log = logging.getLogger(__name__)

#: How soon a worker asks again about a row another worker held.
RETRY_LOCKED_S = 0.25
#: And after its own attempt failed (the database away, say).
RETRY_FAILED_S = 1.0


def check_schedules(schedules: Sequence[Schedule], agent_names: Iterable[str]) -> None:
    """Refuse a worker whose schedules name an agent it does not have, or share a name."""
    known = set(agent_names)
    seen: set[str] = set()
    for schedule in schedules:
        if schedule.name in seen:
            raise ConfigError(
                f"two schedules are named {schedule.name!r}", fix="rename one of them"
            )
        seen.add(schedule.name)
        if schedule.agent not in known:
            listed = ", ".join(sorted(known)) or "none"
            raise ConfigError(
                f"schedule {schedule.name!r} is for agent {schedule.agent!r}, which no module "
                f"in LEDGERLOOP_AGENT_MODULES registers (known: {listed})",
                fix="fix the schedule's agent name, or add the agent's module to "
                "LEDGERLOOP_AGENT_MODULES",
            )


def for_agent(agent_name: str, schedules: Iterable[Schedule]) -> list[Schedule]:
    """An agent's declared schedules, each naming it."""
    out = []
    for schedule in schedules:
        if schedule.agent not in (None, agent_name):
            raise ConfigError(
                f"schedule {schedule.name!r} is declared on agent {agent_name!r} but names "
                f"agent {schedule.agent!r}",
                fix="drop agent= on a schedule declared in an agent's schedules",
            )
        out.append(replace(schedule, agent=agent_name))
    return out


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def keep_schedules(
    pool: ConnectionPool[Conn],
    schedules: Sequence[Schedule],
    stop: asyncio.Event,
    clock: Callable[[], datetime] = _utcnow,
) -> None:
    """Declare the schedules, then decide each tick as it comes until `stop`."""
    if not schedules:
        return

    def declare() -> None:
        with pool.connection() as conn:
            for schedule in schedules:
                if schedule_declare(conn, schedule, clock()):
                    log.info("schedule %s: definition written (%s)", schedule.name, schedule.cron)

    while True:
        try:
            await asyncio.to_thread(declare)
            break
        except Exception:
            # A worker starting while the database blinks keeps its schedules all the same.
            log.exception(
                "writing schedule definitions failed; trying again in %.0f s", RETRY_FAILED_S
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RETRY_FAILED_S)
        if stop.is_set():
            return
    # The tick each schedule was last seen decided by this worker: asked again only once a
    # later tick is due (or the row was locked).
    seen: dict[str, datetime | None] = {s.name: None for s in schedules}

    def fire_due(now: datetime) -> bool:
        locked = False
        with pool.connection() as conn:
            for schedule in schedules:
                latest = schedule.parsed.latest_at_or_before(now, schedule.zone)
                last_seen = seen[schedule.name]
                if latest is None or (last_seen is not None and latest <= last_seen):
                    continue
                outcome, run_id = schedule_fire(conn, schedule, now)
                if outcome == "locked":
                    locked = True
                    continue
                seen[schedule.name] = latest
                if outcome == "fired":
                    log.info("schedule %s: tick %s started run %s", schedule.name, latest, run_id)
                elif outcome == "skipped":
                    log.info("schedule %s: missed tick %s skipped", schedule.name, latest)
        return locked

    while not stop.is_set():
        now = clock()
        retry_s: float | None = None
        try:
            if await asyncio.to_thread(fire_due, now):
                retry_s = RETRY_LOCKED_S
        except Exception:
            # The database is away, say: the tick is decided by whoever reaches it next.
            log.exception("deciding schedule ticks failed; trying again in %.0f s", RETRY_FAILED_S)
            retry_s = RETRY_FAILED_S
        upcoming = min(s.parsed.next_after(now, s.zone) for s in schedules)
        wait = max(0.0, (upcoming - clock()).total_seconds())
        if retry_s is not None:
            wait = min(wait, retry_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
