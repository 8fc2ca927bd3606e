"""Five-field cron expressions (``minute hour day-of-month month day-of-week``), in UTC or a named zone.

Why cronsim: a schedule in a time zone with daylight saving time has two hard cases, the skipped hour and
the repeated one, and the cron people already know (Debian's) has settled answers for both; cronsim
implements them and is well kept, so agentd does not. This module is the seam: it keeps agentd's own
contract (exactly five fields, a clear ``ConfigError`` naming the expression, "never fires" found at start-up,
the next fire strictly after a given instant, returned in UTC) and the zone ``--cron-tz`` names.

What the expressions mean is cronsim's (and Debian cron's): ``*``, numbers, ranges ``a-b``, steps ``*/n`` and
``a-b/n``, lists, English three-letter month and weekday names; day-of-week 0-7 (0 and 7 are Sunday), ``L``
(the last day or weekday of a month), ``nW`` and ``d#n``. When both day fields are restricted (neither starts
with ``*``) a day matches if *either* does. In a zone with daylight saving time a job at a fixed time in the
skipped hour runs at the first minute after the gap, and one in the repeated hour runs once; a job every
minute or every hour just follows the clock.
"""

from __future__ import annotations

import datetime as dt

import attrs
from cronsim import CronSim, CronSimError

from agentd.defaults import CRON_TIME_ZONE
from agentd.errors import ConfigError

#: A placeholder start for checking an expression: the check's answer does not depend on the date.
_CHECK_FROM = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def zone(name: str | None, *, flag: str = "--cron-tz") -> dt.tzinfo:
    """The time zone an IANA ``name`` names (``None`` or ``UTC``: UTC). Raises :class:`ConfigError`."""
    if name is None or name.strip().upper() in {"UTC", "Z", "ETC/UTC"}:
        return dt.UTC
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # the zone database: only for a named zone

    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{flag} {name!r}: not a known time zone (an IANA name such as Europe/Berlin, "
                          "or UTC)") from None


@attrs.frozen
class CronSchedule:
    """A checked expression and the zone its fields are read in."""

    expression: str
    tz: dt.tzinfo = dt.UTC

    @classmethod
    def parse(cls, expression: str, tz_name: str | None = CRON_TIME_ZONE) -> CronSchedule:
        """Raises :class:`ConfigError` naming the expression and the bad field, or saying it never fires."""
        fields = expression.split()
        if len(fields) != 5:
            raise ConfigError(f"--cron {expression!r}: expected 5 fields (minute hour day month weekday), "
                              f"got {len(fields)}")
        tz = zone(tz_name)
        try:
            CronSim(expression, _CHECK_FROM)
        except CronSimError as exc:
            raise ConfigError(_explain(expression, fields, exc)) from None
        return cls(expression, tz)

    def next_after(self, when: dt.datetime) -> dt.datetime:
        """The first matching minute strictly after ``when`` (aware, or naive meaning UTC), in UTC.

        Raises ``ValueError`` when nothing matches within cronsim's horizon (fifty years)."""
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        try:
            fire = next(CronSim(self.expression, when.astimezone(self.tz)))
        except StopIteration:
            raise ValueError(f"cron {self.expression!r} never fires") from None
        return fire.astimezone(dt.UTC)


def _explain(expression: str, fields: list[str], exc: CronSimError) -> str:
    """cronsim says "Bad day-of-month" both for a malformed field and for a day no named month has
    (``0 0 30 2 *``): the same day field with every month tells the two apart."""
    reason = str(exc).lower()
    if reason == "bad day-of-month":
        try:
            CronSim(f"0 0 {fields[2]} * *", _CHECK_FROM)
        except CronSimError:
            pass
        else:
            return f"--cron {expression!r} never fires (no such date in the calendar)"
    return f"--cron {expression!r}: {reason or 'not a cron expression'} field"
