"""Durations: ms|s|m|h|d or bare seconds, stored as float seconds."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentd.config.durations import parse_duration

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("1.5s", 1.5), ("10m", 600.0), ("2h", 7200.0), ("30d", 2592000.0), ("30", 30.0), ("0", 0.0), (".5s", 0.5),
     (" 5 s ", 5.0), ("7.", 7.0)],
)
def test_examples(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "s", "-1", "-1s", "1w", "1 hour", "1e3", "nan", "inf", "1.2.3s", "1ms5",
                                 "１s"])
def test_rejects(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(bad)
    assert repr(bad) in str(info.value)


def test_numbers_pass_through_and_bool_is_not_a_number() -> None:
    assert parse_duration(3) == 3.0
    assert parse_duration(0.25) == 0.25
    with pytest.raises(ValueError):
        parse_duration(True)
    with pytest.raises(ValueError):
        parse_duration(-0.5)
    with pytest.raises(ValueError):
        parse_duration(math.inf)


@given(
    number=st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False, allow_infinity=False),
    unit=st.sampled_from(sorted(UNITS)),
)
def test_any_number_with_any_unit(number: object, unit: str) -> None:
    text = f"{number}{unit}"
    assert parse_duration(text) == pytest.approx(float(str(number)) * UNITS[unit], rel=1e-12, abs=1e-12)


@given(st.text(max_size=12))
def test_never_crashes_and_never_negative(text: str) -> None:
    try:
        value = parse_duration(text)
    except ValueError:
        return
    assert value >= 0 and math.isfinite(value)
