"""The schedule mode's cron dependency (agentd.config.cron), pinned for the cases the driver relies on."""

import datetime as dt

import pytest

from agentd.config.cron import CronSchedule as CronExpr
from agentd.errors import ConfigError


def at(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("* * * * *", at(2026, 1, 1, 10, 0, 30), at(2026, 1, 1, 10, 1)),
        ("*/15 * * * *", at(2026, 1, 1, 10, 0), at(2026, 1, 1, 10, 15)),
        ("*/15 * * * *", at(2026, 1, 1, 10, 59), at(2026, 1, 1, 11, 0)),
        ("0 0 * * *", at(2026, 12, 31, 23, 59), at(2027, 1, 1, 0, 0)),
        ("30 9 * * mon-fri", at(2026, 11, 28, 12, 0), at(2026, 11, 30, 9, 30)),  # Saturday -> Monday
        ("0 12 1 * *", at(2026, 1, 15), at(2026, 2, 1, 12, 0)),
        ("0 0 29 2 *", at(2026, 3, 1), at(2028, 2, 29, 0, 0)),  # leap day
        ("0 0 1,15 * sun", at(2026, 11, 2), at(2026, 11, 8, 0, 0)),  # either day field matches (Vixie)
        ("0 0 * * 7", at(2026, 11, 2), at(2026, 11, 8, 0, 0)),  # 7 is Sunday
        ("10-40/10 3 * jan *", at(2026, 1, 1, 3, 10), at(2026, 1, 1, 3, 20)),
        ("5/20 * * * *", at(2026, 1, 1, 0, 6), at(2026, 1, 1, 0, 25)),
    ],
)
def test_next_fire(expr: str, after: dt.datetime, expected: dt.datetime) -> None:
    assert CronExpr.parse(expr).next_after(after) == expected


def test_next_fire_is_strictly_later() -> None:
    expr = CronExpr.parse("0 * * * *")
    assert expr.next_after(at(2026, 1, 1, 5, 0)) == at(2026, 1, 1, 6, 0)
    assert expr.next_after(at(2026, 1, 1, 5, 59, 59)) == at(2026, 1, 1, 6, 0)


@pytest.mark.parametrize(
    "bad", ["", "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *", "*/0 * * * *",
            "5-1 * * * *", "a * * * *", "1,,2 * * * *", "* * * foo *"],
)
def test_rejects_bad_expressions(bad: str) -> None:
    with pytest.raises(ConfigError):
        CronExpr.parse(bad)


# --- --cron-tz: the fields are read in a named zone, the fire comes back in UTC ------------------------------


def test_a_named_zone_reads_the_fields_in_local_time() -> None:
    berlin = CronExpr.parse("30 9 * * mon-fri", "Europe/Berlin")
    assert berlin.next_after(at(2026, 1, 5, 7, 0)) == at(2026, 1, 5, 8, 30)  # CET: UTC+1
    assert berlin.next_after(at(2026, 7, 6, 7, 0)) == at(2026, 7, 6, 7, 30)  # CEST: UTC+2
    assert CronExpr.parse("30 9 * * *", None).next_after(at(2026, 1, 5, 7, 0)) == at(2026, 1, 5, 9, 30)
    assert CronExpr.parse("30 9 * * *", "UTC").tz is dt.UTC


def test_a_fixed_time_in_the_skipped_hour_runs_once_right_after_the_gap() -> None:
    # Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 does not exist that day.
    expr = CronExpr.parse("30 2 * * *", "Europe/Berlin")
    fire = expr.next_after(at(2026, 3, 28, 12, 0))
    assert fire == at(2026, 3, 29, 1, 0)  # 03:00 CEST, the first minute after the gap
    assert expr.next_after(fire) == at(2026, 3, 30, 0, 30)  # then 02:30 CEST again


def test_a_fixed_time_in_the_repeated_hour_runs_once() -> None:
    # Berlin, 2026-10-25: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice (00:30 and 01:30 UTC).
    expr = CronExpr.parse("30 2 * * *", "Europe/Berlin")
    fire = expr.next_after(at(2026, 10, 24, 12, 0))
    assert fire == at(2026, 10, 25, 0, 30)
    assert expr.next_after(fire) == at(2026, 10, 26, 1, 30)  # not 01:30 UTC on the 25th


def test_an_every_quarter_hour_job_follows_the_clock_through_the_repeated_hour() -> None:
    expr = CronExpr.parse("*/15 * * * *", "Europe/Berlin")
    fires, when = [], at(2026, 10, 24, 23, 50)
    for _ in range(10):
        when = expr.next_after(when)
        fires.append(when)
    assert fires == [at(2026, 10, 25, 0, m) for m in (0, 15, 30, 45)] + [
        at(2026, 10, 25, 1, m) for m in (0, 15, 30, 45)] + [at(2026, 10, 25, 2, 0), at(2026, 10, 25, 2, 15)]


@pytest.mark.parametrize("bad", ["Mars/Olympus", "", "../../etc/passwd", "Europe/"])
def test_an_unknown_zone_is_a_config_error_naming_the_flag(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"--cron-tz .*not a known time zone"):
        CronExpr.parse("* * * * *", bad)
