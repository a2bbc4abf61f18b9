"""`Schedule`: runs of an agent made on a cron expression, one per tick for the whole fleet.

An agent declares its schedules (`Agent(..., schedules=(Schedule(...),))`), or a module
registers one for an agent by name (`register_schedule(Schedule(..., agent="triage"))`).
Every worker whose agent modules declare a schedule keeps its ticks; the database decides
which worker makes each tick's run (schedules/ticker.py).
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ledgerloop.errors import ConfigError
from ledgerloop.schedules.cron import Cron, CronError

#: What a tick missed while no worker ran becomes: `catch_up` makes one run for the latest
#: missed tick (however many were missed), `skip` makes none.
MissedTicks = Literal["skip", "catch_up"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


# eq=False: two schedules are the same only when they are one object (as agents are), and
# a schedule stays hashable although its input is a dict.
@dataclass(frozen=True, eq=False)
class Schedule:
    """Start a run of `agent` with `input` at every tick of `cron`, on `timezone`'s clock.

    `name` is the schedule's identity in the database (and in its runs' idempotency keys):
    unique across the fleet, and kept when the expression or input changes. `agent` is
    implied when the schedule is declared on an Agent. `tenant_id`: whose runs they are
    (default: the default tenant).
    """

    name: str
    cron: str
    input: dict[str, Any] = field(default_factory=dict)
    timezone: str = "UTC"
    missed: MissedTicks = "catch_up"
    agent: str | None = None
    tenant_id: uuid.UUID | None = None

    def __post_init__(self) -> None:
        where = f"schedule {self.name!r}"
        if not _NAME.match(self.name):
            raise ConfigError(
                f"{where}: the name must be 1-100 letters, digits, '_', '.' or '-'",
                fix="rename the schedule",
            )
        try:
            Cron.parse(self.cron)
        except CronError as exc:
            raise ConfigError(
                f"{where}: cron {self.cron!r} does not parse: {exc}",
                fix="give 5 fields (minute hour day month weekday) or 6 with seconds first, "
                "e.g. '0 2 * * *' for 02:00 every day",
            ) from None
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(
                f"{where}: unknown time zone {self.timezone!r}",
                fix="use an IANA name such as 'UTC' or 'Europe/Paris'",
            ) from None
        if self.missed not in ("skip", "catch_up"):
            raise ConfigError(
                f"{where}: missed={self.missed!r} is not a policy",
                fix="use missed='catch_up' (one run for the ticks missed) or missed='skip'",
            )
        if not isinstance(self.input, dict):
            raise ConfigError(f"{where}: input must be a JSON object (a dict)", fix="wrap it")

    @cached_property
    def parsed(self) -> Cron:
        return Cron.parse(self.cron)

    @cached_property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


_SCHEDULES: dict[str, Schedule] = {}
_ORIGINS: dict[str, str] = {}


def register_schedule(schedule: Schedule) -> Schedule:
    """Declare a schedule for an agent by name (`agent=` is required here)."""
    if schedule.agent is None:
        raise ConfigError(
            f"schedule {schedule.name!r} names no agent",
            fix="pass agent='...' or declare it in the agent's schedules",
        )
    existing = _SCHEDULES.get(schedule.name)
    if existing is not None and existing is not schedule:
        raise ConfigError(f"two schedules are named {schedule.name!r}", fix="rename one of them")
    _SCHEDULES[schedule.name] = schedule
    _ORIGINS.setdefault(schedule.name, str(sys._getframe(1).f_globals.get("__name__", "")))
    return schedule


def registered_from(modules: Iterable[str]) -> list[Schedule]:
    """The schedules `register_schedule` got from these modules."""
    wanted = set(modules)
    return [s for name, s in _SCHEDULES.items() if _ORIGINS.get(name) in wanted]
