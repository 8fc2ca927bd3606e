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
