"""Durations as operators write them: ``250ms``, ``1.5s``, ``10m``, ``2h`` or bare seconds (``30``).

The model stores float seconds so every deadline can go straight into ``trio.fail_after``.
"""

from __future__ import annotations

import math
import re
from typing import Final

from agentd.deferred.patterns import Pattern

_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION: Final = Pattern(r"^\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>ms|s|m|h|d)?\s*$", re.ASCII)


def parse_duration(value: str | float | int) -> float:
    """Parse a non-negative duration into seconds.

    Raises:
        ValueError: with a message quoting the value, when it is not ``<number>[ms|s|m|h|d]`` or is negative,
            infinite or not a number.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"not a duration (use <number>[ms|s|m|h|d]): {value!r}")
        seconds = float(match["number"]) * _UNITS[match["unit"] or "s"]
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a duration (must be finite and >= 0): {value!r}")
    return seconds

