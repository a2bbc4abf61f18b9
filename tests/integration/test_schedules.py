"""Schedule rows on a real database: one decision per tick, the missed-ticks policies, pause
and resume, a changed definition, an operator's trigger, and a second connection that finds
the row taken. `now` is passed in, so no test waits for a clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ledgerloop.db.connect import Conn, connect
from ledgerloop.errors import ConfigError
from ledgerloop.schedules.definition import Schedule
from ledgerloop.schedules.store import (
    UnknownSchedule,
    schedule_declare,
    schedule_fire,
    schedule_get,
    schedule_set_paused,
    schedule_trigger,
    tick_key,
)
from ledgerloop.schedules.ticker import check_schedules, for_agent

T0 = datetime(2025, 6, 1, 2, 0, tzinfo=UTC)  # before the real clock (resume reads it)


def hourly(missed: str = "catch_up", **changes: object) -> Schedule:
    fields: dict[str, object] = {
        "name": "hourly-report",
        "cron": "0 * * * *",
        "input": {"message": "report"},
        "agent": "looper",
        "missed": missed,
    }
    fields.update(changes)
    return Schedule(**fields)  # type: ignore[arg-type]


def runs_of(conn: Conn, name: str) -> list[str]:
    rows = conn.execute(
        "SELECT idempotency_key FROM ledgerloop.agent_run WHERE idempotency_key LIKE %s "
        "ORDER BY idempotency_key",
        (f"schedule:{name}:%",),
    ).fetchall()
    return [r["idempotency_key"] for r in rows]


def test_each_tick_is_decided_once(conn: Conn) -> None:
    schedule = hourly()
    schedule_declare(conn, schedule, T0 + timedelta(minutes=30))  # created at 02:30
    # Nothing is due before 03:00: the 02:00 tick came before the schedule existed.
    assert schedule_fire(conn, schedule, T0 + timedelta(minutes=59))[0] == "decided"
    outcome, run_id = schedule_fire(conn, schedule, T0 + timedelta(hours=1, seconds=1))
    assert outcome == "fired"
    assert run_id is not None
    assert schedule_fire(conn, schedule, T0 + timedelta(hours=1, seconds=2))[0] == "decided"
    assert runs_of(conn, schedule.name) == [tick_key(schedule.name, T0 + timedelta(hours=1))]
    row = schedule_get(conn, schedule.name)
    assert row.last_run_id == run_id
    assert row.last_tick == T0 + timedelta(hours=1)


@pytest.mark.parametrize(("missed", "runs"), [("catch_up", 1), ("skip", 0)])
def test_ticks_missed_while_no_worker_ran(conn: Conn, missed: str, runs: int) -> None:
    schedule = hourly(missed)
    schedule_declare(conn, schedule, T0)
    # Back five hours and ten minutes later: five ticks were missed, the latest 10 min ago.
    back = T0 + timedelta(hours=5, minutes=10)
    outcome, _ = schedule_fire(conn, schedule, back)
    assert outcome == ("fired" if runs else "skipped")
    assert len(runs_of(conn, schedule.name)) == runs
    if runs:  # the one catch-up run is the latest missed tick's
        assert runs_of(conn, schedule.name) == [tick_key(schedule.name, T0 + timedelta(hours=5))]
    # The next tick runs on time under either policy.
    assert schedule_fire(conn, schedule, T0 + timedelta(hours=6, seconds=3))[0] == "fired"
    assert len(runs_of(conn, schedule.name)) == runs + 1


def test_a_paused_schedule_makes_no_run_and_resumes_without_catching_up(conn: Conn) -> None:
    schedule = hourly()
    schedule_declare(conn, schedule, T0)
    assert schedule_set_paused(conn, schedule.name, True).paused
    assert schedule_fire(conn, schedule, T0 + timedelta(hours=1, seconds=1))[0] == "paused"
    assert runs_of(conn, schedule.name) == []
    # Resumed now (the real clock, later than every tick of this test): the paused ticks
    # are not missed ones, so nothing runs for them.
    assert not schedule_set_paused(conn, schedule.name, False).paused
    assert schedule_fire(conn, schedule, T0 + timedelta(hours=3))[0] == "decided"
    assert runs_of(conn, schedule.name) == []


def test_a_changed_definition_makes_no_second_run_for_the_current_tick(conn: Conn) -> None:
    schedule = hourly()
    schedule_declare(conn, schedule, T0 - timedelta(minutes=1))
    assert schedule_fire(conn, schedule, T0 + timedelta(seconds=1))[0] == "fired"
    # A deploy 20 s later: every 30 minutes now, with another input. 02:00 is a tick of both.
    changed = hourly(cron="*/30 * * * *", input={"message": "report v2"})
    assert schedule_declare(conn, changed, T0 + timedelta(seconds=20))
    assert schedule_fire(conn, changed, T0 + timedelta(seconds=21))[0] == "decided"
    assert schedule_fire(conn, changed, T0 + timedelta(minutes=30, seconds=1))[0] == "fired"
    assert len(runs_of(conn, schedule.name)) == 2
    # Declaring the same definition again changes nothing.
    assert not schedule_declare(conn, changed, T0 + timedelta(minutes=31))


def test_a_worker_finds_the_row_taken_while_another_decides(conn: Conn, db_url: str) -> None:
    schedule = hourly()
    schedule_declare(conn, schedule, T0)
    with connect(db_url) as other, other.transaction():
        other.execute(
            "SELECT 1 FROM ledgerloop.schedule WHERE name = %s FOR UPDATE", (schedule.name,)
        )
        assert schedule_fire(conn, schedule, T0 + timedelta(hours=1))[0] == "locked"
    assert schedule_fire(conn, schedule, T0 + timedelta(hours=1))[0] == "fired"


def test_trigger_starts_a_run_now_and_the_same_key_returns_it(conn: Conn) -> None:
    schedule = hourly()
    schedule_declare(conn, schedule, T0)
    schedule_set_paused(conn, schedule.name, True)
    first = schedule_trigger(conn, schedule.name, key="op-1")
    assert schedule_trigger(conn, schedule.name, key="op-1") == first
    assert schedule_trigger(conn, schedule.name) != first
    assert schedule_get(conn, schedule.name).last_run_id is not None
    with pytest.raises(UnknownSchedule, match="no schedule is named 'nope'"):
        schedule_trigger(conn, "nope")


def test_a_schedule_for_an_agent_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ConfigError, match="schedule 'hourly-report' is for agent 'ghost'"):
        check_schedules([hourly(agent="ghost")], ["looper"])
    with pytest.raises(ConfigError, match="declared on agent 'looper' but names agent 'picky'"):
        for_agent("looper", [hourly(agent="picky")])
    with pytest.raises(ConfigError, match="two schedules are named 'hourly-report'"):
        check_schedules([hourly(), hourly()], ["looper"])
