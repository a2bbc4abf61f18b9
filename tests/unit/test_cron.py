"""Cron expressions: fields, names, steps, the day-of-month/weekday rule, and time zones
across daylight-saving changes."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from ledgerloop.errors import ConfigError
from ledgerloop.schedules.cron import Cron, CronError
from ledgerloop.schedules.definition import Schedule

UTC_ZONE = ZoneInfo("UTC")
NEW_YORK = ZoneInfo("America/New_York")


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("*/5 * * * * *", at(2026, 12, 6, 2, 0, 3), at(2026, 12, 6, 2, 0, 5)),
        ("*/5 * * * * *", at(2026, 12, 6, 2, 0, 5), at(2026, 12, 6, 2, 0, 10)),
        ("0 2 * * *", at(2026, 12, 31, 3), at(2027, 1, 1, 2)),
        ("15,45 */6 * * *", at(2026, 1, 1, 6, 20), at(2026, 1, 1, 6, 45)),
        ("0 9 * * mon-fri", at(2026, 12, 5, 10), at(2026, 12, 7, 9)),  # Saturday -> Monday
        ("0 0 * * 7", at(2026, 12, 7), at(2026, 12, 13)),  # 7 is Sunday
        ("0 0 1 jan,jul *", at(2026, 2, 1), at(2026, 7, 1)),
        ("0 0 29 2 *", at(2026, 3, 1), at(2028, 2, 29)),
        # Both day fields restricted: either matches (the 13th, or a Friday).
        ("0 0 13 * fri", at(2026, 12, 6), at(2026, 12, 11)),
        ("@hourly", at(2026, 1, 1, 0, 59, 59), at(2026, 1, 1, 1)),
        ("10-20/5 * * * *", at(2026, 1, 1, 0, 16), at(2026, 1, 1, 0, 20)),
    ],
)
def test_next_tick(expression: str, after: datetime, expected: datetime) -> None:
    cron = Cron.parse(expression)
    assert cron.next_after(after, UTC_ZONE) == expected
    # And back: a tick is its own latest; the latest at or before `after` leads to it.
    assert cron.latest_at_or_before(expected, UTC_ZONE) == expected
    previous = cron.latest_at_or_before(after, UTC_ZONE)
    assert previous is not None
    assert previous <= after
    assert cron.next_after(previous, UTC_ZONE) == expected


def test_a_skipped_local_time_has_no_tick_and_a_repeated_one_ticks_once() -> None:
    daily = Cron.parse("30 2 * * *")
    # 2026-03-08 02:30 does not exist in New York: the next tick is the 9th's (EDT, UTC-4).
    assert daily.next_after(at(2026, 3, 7, 12), NEW_YORK) == at(2026, 3, 9, 6, 30)
    repeated = Cron.parse("30 1 * * *")
    # 2026-11-01 01:30 happens twice; its tick is the first (EDT, 05:30 UTC), not the second.
    assert repeated.next_after(at(2026, 11, 1, 0), NEW_YORK) == at(2026, 11, 1, 5, 30)
    assert repeated.next_after(at(2026, 11, 1, 5, 30), NEW_YORK) == at(2026, 11, 2, 6, 30)


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("* * *", "has 3 fields"),
        ("61 * * * *", "minute field: 61 is outside 0-59"),
        ("*/0 * * * *", "step '0' is not a positive number"),
        ("5-1 * * * *", "range '5-1' runs backwards"),
        ("0 0 30 2 *", "never matches"),
        ("0 0 * * noday", "weekday field: 'noday' is not a number"),
    ],
)
def test_a_bad_expression_says_what_is_wrong(expression: str, says: str) -> None:
    with pytest.raises(CronError, match=says):
        Cron.parse(expression)


def test_a_schedule_names_its_bad_setting() -> None:
    with pytest.raises(ConfigError, match=r"schedule 'nightly': cron '0 25 \* \* \*' does not"):
        Schedule("nightly", "0 25 * * *")
    with pytest.raises(ConfigError, match="schedule 'nightly': unknown time zone 'Mars/Olympus'"):
        Schedule("nightly", "0 2 * * *", timezone="Mars/Olympus")
    with pytest.raises(ConfigError, match="missed='sometimes' is not a policy"):
        Schedule("nightly", "0 2 * * *", missed="sometimes")  # type: ignore[arg-type]
