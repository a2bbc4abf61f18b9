"""The schedule rows: declared by workers, locked to decide a tick, changed by operators.

A tick is decided once: the transaction that locks a schedule's row starts the tick's run
(through `start_run`, so the run is created, scoped and enqueued as every other run) and moves
`last_tick` to it. A worker killed in between commits neither; the next worker to lock the
row makes the run. The run's idempotency key, `schedule:{name}:{tick}`, is the second lock: a
start of a tick already made returns the run made first.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

from psycopg.types.json import Jsonb

from ledgerloop import faults
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import Conn
from ledgerloop.db.sql import load_queries
from ledgerloop.errors import LedgerloopError
from ledgerloop.runs.start import start_run
from ledgerloop.schedules.definition import Schedule

Q = load_queries("ledgerloop.schedules")

#: A tick run within this long of its time is on time (both policies run it); later, it was
#: missed and the schedule's policy decides.
ON_TIME = timedelta(seconds=60)


class UnknownSchedule(LedgerloopError):
    """No schedule has this name (a worker creates a schedule's row when it starts)."""

    status_code: ClassVar[int] = 404


@dataclass(frozen=True)
class ScheduleRow:
    name: str
    tenant_id: uuid.UUID
    agent: str
    cron: str
    timezone: str
    input: dict[str, Any]
    missed: str
    paused: bool
    last_tick: datetime
    last_run_id: uuid.UUID | None
    declared_at: datetime
    updated_at: datetime


def tick_key(name: str, tick: datetime) -> str:
    """The idempotency key of a tick's run: the same for every worker and every retry."""
    return f"schedule:{name}:{tick.strftime('%Y-%m-%dT%H:%M:%SZ')}"


def due_tick(
    schedule: Schedule, last_tick: datetime, now: datetime
) -> tuple[datetime, bool] | None:
    """The latest tick at or before `now` not yet decided, and whether it gets a run; None
    when every tick up to `now` is decided. Older undecided ticks are folded into it: a
    worker back after an outage makes at most one run (`catch_up`) or none (`skip`)."""
    latest = schedule.parsed.latest_at_or_before(now, schedule.zone)
    if latest is None or latest <= last_tick:
        return None
    return latest, (now - latest <= ON_TIME or schedule.missed == "catch_up")


def _params(schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "tenant_id": schedule.tenant_id or DEFAULT_TENANT,
        "agent": schedule.agent,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "input": Jsonb(schedule.input),
        "missed": schedule.missed,
    }


def schedule_declare(conn: Conn, schedule: Schedule, now: datetime) -> bool:
    """Write the code's definition to the schedule's row (creating it); True when it changed.

    A new schedule, or one whose definition changed, starts at its next tick: every tick up
    to now counts as decided, so a deploy never makes a run for a tick the previous
    definition already ran (or one from before the schedule existed)."""
    latest = schedule.parsed.latest_at_or_before(now, schedule.zone) or now
    with conn.transaction():
        conn.execute(Q["schedule_insert"], {**_params(schedule), "last_tick": latest})
        row = conn.execute(Q["schedule_lock"], {"name": schedule.name}).fetchone()
        assert row is not None
        params = _params(schedule)
        fields = ("tenant_id", "agent", "cron", "timezone", "missed")
        changed = row["input"] != schedule.input or any(row[f] != params[f] for f in fields)
        conn.execute(
            Q["schedule_declare"],
            {**params, "changed": changed, "last_tick": latest if changed else row["last_tick"]},
        )
    return changed


Outcome = Literal["locked", "paused", "decided", "fired", "skipped"]


def schedule_fire(
    conn: Conn, schedule: Schedule, now: datetime
) -> tuple[Outcome, uuid.UUID | None]:
    """Decide the schedule's due tick, if any, in one transaction.

    `locked`: another worker holds the row (deciding this tick; ask again shortly).
    `decided`: nothing due. `fired`: a run was made. `skipped`: a missed tick under `skip`."""
    with conn.transaction():
        row = conn.execute(Q["schedule_claim_due"], {"names": [schedule.name]}).fetchone()
        if row is None:
            return "locked", None
        if row["paused"]:
            return "paused", None
        due = due_tick(schedule, row["last_tick"], now)
        if due is None:
            return "decided", None
        tick, make = due
        run_id = None
        if make:
            assert schedule.agent is not None
            run_id = start_run(
                conn,
                agent=schedule.agent,
                input=schedule.input,
                idempotency_key=tick_key(schedule.name, tick),
                tenant_id=schedule.tenant_id or DEFAULT_TENANT,
            )
        # The run is started, the tick not yet marked: a kill here commits neither.
        faults.hit("schedule.before_decided")
        conn.execute(
            Q["schedule_tick_decided"], {"name": schedule.name, "tick": tick, "run_id": run_id}
        )
    return ("fired" if make else "skipped"), run_id


def schedule_list(conn: Conn) -> list[ScheduleRow]:
    return [ScheduleRow(**row) for row in conn.execute(Q["schedule_list"]).fetchall()]


def schedule_get(conn: Conn, name: str) -> ScheduleRow:
    row = conn.execute(Q["schedule_get"], {"name": name}).fetchone()
    if row is None:
        raise UnknownSchedule(
            f"no schedule is named {name!r}",
            fix="`ledgerloop schedules list` shows them; a schedule appears once a worker "
            "with it in its agent modules has started",
        )
    return ScheduleRow(**row)


def schedule_set_paused(conn: Conn, name: str, paused: bool) -> ScheduleRow:
    """Pause (no runs until resumed) or resume (from the next tick; no catch-up)."""
    row = conn.execute(Q["schedule_set_paused"], {"name": name, "paused": paused}).fetchone()
    if row is None:
        schedule_get(conn, name)  # raises UnknownSchedule
    assert row is not None
    return ScheduleRow(**row)


def schedule_trigger(conn: Conn, name: str, key: str | None = None) -> uuid.UUID:
    """Start a run of the schedule now, outside its ticks (paused or not), with its input.
    The same `key` returns the run it made first."""
    with conn.transaction():
        row = schedule_get(conn, name)
        run_id = start_run(
            conn,
            agent=row.agent,
            input=row.input,
            idempotency_key=f"schedule:{name}:trigger:{key or uuid.uuid4()}",
            tenant_id=row.tenant_id,
        )
        conn.execute(Q["schedule_triggered"], {"name": name, "run_id": run_id})
    return run_id
