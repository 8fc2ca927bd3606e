"""Five-field cron expressions, UTC: ``minute hour day-of-month month day-of-week``.

Fields take ``*``, numbers, ranges ``a-b``, steps ``*/n`` and ``a-b/n``, lists ``a,b``, and the English
three-letter names for months and weekdays. Day-of-week is 0-7 (0 and 7 are Sunday). As in classic cron,
when both day fields are restricted a day matches if *either* does.
"""

from __future__ import annotations

import calendar
import datetime as dt
from typing import Final

import attrs

from agentd.errors import ConfigError

_FIELDS: Final = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12),
                  ("day-of-week", 0, 7))
_MONTHS: Final = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS: Final = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}


@attrs.frozen
class CronSchedule:
    """A parsed expression: the allowed values of each field."""

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    def parse(cls, expression: str) -> CronSchedule:
        """Raises :class:`ConfigError` naming the expression and the bad field."""
        fields = expression.split()
        if len(fields) != 5:
            raise ConfigError(f"--cron {expression!r}: expected 5 fields (minute hour day month weekday), "
                              f"got {len(fields)}")
        values = [_parse_field(expression, text, *spec) for text, spec in zip(fields, _FIELDS, strict=True)]
        weekdays = frozenset(d % 7 for d in values[4])
        return cls(expression, values[0], values[1], values[2], values[3], weekdays,
                   fields[2] != "*", fields[4] != "*")

    def matches(self, when: dt.datetime) -> bool:
        return (
            when.minute in self.minutes
            and when.hour in self.hours
            and when.month in self.months
            and self._day_matches(when)
        )

    def next_after(self, when: dt.datetime) -> dt.datetime:
        """The first matching minute strictly after ``when`` (an aware or naive-UTC datetime)."""
        tz = when.tzinfo
        candidate = when.replace(second=0, microsecond=0, tzinfo=None) + dt.timedelta(minutes=1)
        limit = candidate + dt.timedelta(days=366 * 9)  # Feb 29 recurs within 8 years
        while candidate <= limit:
            if candidate.month not in self.months:
                year, month = (candidate.year + 1, 1) if candidate.month == 12 else (candidate.year,
                                                                                      candidate.month + 1)
                candidate = dt.datetime(year, month, 1)
                continue
            if not self._day_matches(candidate):
                candidate = dt.datetime(candidate.year, candidate.month, candidate.day) + dt.timedelta(days=1)
                continue
            if candidate.hour not in self.hours:
                candidate = candidate.replace(minute=0) + dt.timedelta(hours=1)
                continue
            if candidate.minute not in self.minutes:
                candidate += dt.timedelta(minutes=1)
                continue
            return candidate.replace(tzinfo=tz)
        raise ValueError(f"cron {self.expression!r} never fires")

    def _day_matches(self, when: dt.datetime) -> bool:
        day_ok = when.day in self.days
        weekday_ok = (when.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return day_ok or weekday_ok
        return day_ok and weekday_ok


def _number(expression: str, name: str, text: str, low: int, high: int) -> int:
    names = _MONTHS if name == "month" else _DAYS if name == "day-of-week" else {}
    value = names.get(text.lower())
    if value is None:
        if not text.isdigit():
            raise ConfigError(f"--cron {expression!r}: bad {name} value {text!r}")
        value = int(text)
    if not low <= value <= high:
        raise ConfigError(f"--cron {expression!r}: {name} value {value} out of range {low}-{high}")
    return value


def _parse_field(expression: str, text: str, name: str, low: int, high: int) -> frozenset[int]:
    allowed: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ConfigError(f"--cron {expression!r}: bad step {step_text!r} in {name}")
            step = int(step_text)
        if span == "*":
            start, stop = low, high
        elif "-" in span:
            first, _, last = span.partition("-")
            start, stop = _number(expression, name, first, low, high), _number(expression, name, last, low, high)
            if start > stop:
                raise ConfigError(f"--cron {expression!r}: empty range {span!r} in {name}")
        else:
            start = _number(expression, name, span, low, high)
            stop = high if step_text else start
        allowed.update(range(start, stop + 1, step))
    return frozenset(allowed)
