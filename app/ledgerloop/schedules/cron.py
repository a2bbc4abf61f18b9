"""Cron expressions: 5 fields (minute hour day month weekday) or 6 with seconds first.

Each field takes `*`, a number, a range `a-b`, a step `*/n`, `a-b/n` or `a/n`, and lists of
those separated by commas; months and weekdays also take their English three-letter names,
and weekday 7 is Sunday like 0. When both the day of the month and the weekday are
restricted, a day matching either one matches (as in Vixie cron). `@hourly`, `@daily`
(`@midnight`), `@weekly`, `@monthly` and `@yearly` (`@annually`) name the usual five-field
expressions.

Ticks are computed on the wall clock of a time zone, then placed on the time line: a local
time that a daylight-saving jump skips does not happen (no tick), and a local time the clock
shows twice (the hour repeated in autumn) is a tick once, at its first occurrence.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_WEEKDAYS = {name: n for n, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
#: How far a search looks before it decides an expression never matches (Feb 29 on a
#: Monday recurs within 28 years).
_HORIZON_YEARS = 30


class CronError(ValueError):
    """A cron expression that does not parse, or that never matches a real date."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_SECOND = _Field("second", 0, 59)
_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DAY = _Field("day of month", 1, 31)
_MONTH = _Field("month", 1, 12, _MONTHS)
_WEEKDAY = _Field("weekday", 0, 7, _WEEKDAYS)


def _number(text: str, field: _Field) -> int:
    lowered = text.lower()
    if field.names and lowered in field.names:
        return field.names[lowered]
    if not text.isdigit():
        raise CronError(f"{field.name} field: {text!r} is not a number")
    value = int(text)
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name} field: {value} is outside {field.low}-{field.high}")
    return value


def _parse_field(text: str, field: _Field) -> tuple[int, ...]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"{field.name} field: empty item in {text!r}")
        body, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{field.name} field: step {step_text!r} is not a positive number")
            step = int(step_text)
        if body in ("*", "?"):
            low, high = field.low, field.high
        elif "-" in body:
            first, _, last = body.partition("-")
            low, high = _number(first, field), _number(last, field)
            if low > high:
                raise CronError(f"{field.name} field: range {body!r} runs backwards")
        else:
            low = _number(body, field)
            # `a/n` means from a to the end, every n; a lone `a` is just a.
            high = field.high if step_text else low
        values.update(range(low, high + 1, step))
    if field is _WEEKDAY and 7 in values:
        values.discard(7)
        values.add(0)
    return tuple(sorted(values))


@dataclass(frozen=True)
class Cron:
    """A parsed expression; `next_after` and `latest_at_or_before` find its ticks."""

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]
    #: Whether the day-of-month / weekday field was `*` (then only the other one decides).
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        fields = _MACROS.get(text.strip().lower(), text).split()
        if len(fields) == 5:
            fields = ["0", *fields]
        if len(fields) != 6:
            raise CronError(
                f"{text!r} has {len(fields)} fields; give 5 (minute hour day month weekday) "
                "or 6 (second first)"
            )
        second, minute, hour, day, month, weekday = fields
        cron = cls(
            text=text,
            seconds=_parse_field(second, _SECOND),
            minutes=_parse_field(minute, _MINUTE),
            hours=_parse_field(hour, _HOUR),
            days=_parse_field(day, _DAY),
            months=_parse_field(month, _MONTH),
            weekdays=_parse_field(weekday, _WEEKDAY),
            any_day=day in ("*", "?"),
            any_weekday=weekday in ("*", "?"),
        )
        if cron._next_local(datetime(2000, 1, 1)) is None:
            raise CronError(f"{text!r} never matches a real date")
        return cron

    def _day_matches(self, day: date) -> bool:
        in_month = day.day in self.days
        # Python counts Monday as 0, cron counts Sunday as 0.
        on_weekday = (day.weekday() + 1) % 7 in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return on_weekday
        if self.any_weekday:
            return in_month
        return in_month or on_weekday

    def _next_local(self, start: datetime) -> datetime | None:
        """The first matching wall-clock time at or after `start` (naive, whole seconds)."""
        t = start
        limit = start.year + _HORIZON_YEARS
        while t.year <= limit:
            if t.month not in self.months:
                i = bisect.bisect_left(self.months, t.month)
                if i < len(self.months):
                    t = datetime(t.year, self.months[i], 1)
                else:
                    t = datetime(t.year + 1, self.months[0], 1)
                continue
            if not self._day_matches(t.date()):
                t = datetime.combine(t.date() + timedelta(days=1), datetime.min.time())
                continue
            ahead = self._next_time(t)
            if ahead is None:
                t = datetime.combine(t.date() + timedelta(days=1), datetime.min.time())
                continue
            return ahead
        return None

    def _next_time(self, t: datetime) -> datetime | None:
        """The first matching time of `t`'s day at or after `t`, or None."""
        for h in self.hours[bisect.bisect_left(self.hours, t.hour) :]:
            for m in self.minutes[
                bisect.bisect_left(self.minutes, t.minute) if h == t.hour else 0 :
            ]:
                same = h == t.hour and m == t.minute
                s_from = bisect.bisect_left(self.seconds, t.second) if same else 0
                if s_from < len(self.seconds):
                    return t.replace(hour=h, minute=m, second=self.seconds[s_from])
        return None

    def _previous_local(self, start: datetime) -> datetime | None:
        """The last matching wall-clock time at or before `start` (naive, whole seconds)."""
        t = start
        limit = start.year - _HORIZON_YEARS
        while t.year >= limit and t.year > 1:
            if t.month not in self.months:
                i = bisect.bisect_right(self.months, t.month) - 1
                year, month = (t.year, self.months[i]) if i >= 0 else (t.year - 1, self.months[-1])
                first_next = datetime(year + month // 12, month % 12 + 1, 1)
                t = first_next - timedelta(seconds=1)
                continue
            if not self._day_matches(t.date()):
                t = datetime.combine(t.date(), datetime.min.time()) - timedelta(seconds=1)
                continue
            back = self._previous_time(t)
            if back is None:
                t = datetime.combine(t.date(), datetime.min.time()) - timedelta(seconds=1)
                continue
            return back
        return None

    def _previous_time(self, t: datetime) -> datetime | None:
        for h in reversed(self.hours[: bisect.bisect_right(self.hours, t.hour)]):
            upto = bisect.bisect_right(self.minutes, t.minute) if h == t.hour else None
            for m in reversed(self.minutes[:upto]):
                same = h == t.hour and m == t.minute
                s_to = bisect.bisect_right(self.seconds, t.second) if same else len(self.seconds)
                if s_to > 0:
                    return t.replace(hour=h, minute=m, second=self.seconds[s_to - 1])
        return None

    def next_after(self, after: datetime, zone: ZoneInfo) -> datetime:
        """The first tick strictly after `after` (an aware time), in UTC."""
        local = after.astimezone(zone).replace(tzinfo=None, microsecond=0) + timedelta(seconds=1)
        while True:
            found = self._next_local(local)
            if found is None:  # pragma: no cover - parse() refused expressions that never match
                raise CronError(f"{self.text!r} has no tick after {after.isoformat()}")
            tick = _placed(found, zone)
            if tick is not None and tick > after:
                return tick
            local = found + timedelta(seconds=1)

    def latest_at_or_before(self, at: datetime, zone: ZoneInfo) -> datetime | None:
        """The last tick at or before `at` (an aware time), in UTC; None if none in range."""
        local = at.astimezone(zone).replace(tzinfo=None, microsecond=0)
        while True:
            found = self._previous_local(local)
            if found is None:
                return None
            tick = _placed(found, zone)
            if tick is not None and tick <= at:
                return tick
            local = found - timedelta(seconds=1)


def _placed(local: datetime, zone: ZoneInfo) -> datetime | None:
    """`local` on the time line (its first occurrence), or None when the clock skips it."""
    aware = local.replace(tzinfo=zone, fold=0)
    utc = aware.astimezone(UTC)
    if utc.astimezone(zone).replace(tzinfo=None) != local:
        return None  # in a daylight-saving gap: this wall-clock time does not happen
    return utc
