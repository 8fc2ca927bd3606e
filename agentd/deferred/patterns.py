"""Regular expressions compiled on first use.

Why: compiling a pattern costs from tens of microseconds to a millisecond of CPU, and agentd's modules define
theirs at import; most are for input a once run's start-up never sees (credential shapes, durations, header
names, trace contexts). A :class:`Pattern` is defined like ``re.compile(...)`` and compiled by its first
match, so the cost moves to the run that needs it (docs/benchmarks.md, "Start-up: what a once run imports").
Patterns every run matches at start-up stay ``re.compile``; so do those on a per-line path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator


class Pattern:
    """A ``re.Pattern[str]`` compiled on first use; the methods agentd uses, with the same arguments."""

    __slots__ = ("_compiled", "flags", "pattern")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern = pattern
        self.flags = flags
        self._compiled: re.Pattern[str] | None = None

    def compiled(self) -> re.Pattern[str]:
        if self._compiled is None:
            self._compiled = re.compile(self.pattern, self.flags)
        return self._compiled

    def match(self, string: str) -> re.Match[str] | None:
        return self.compiled().match(string)

    def fullmatch(self, string: str) -> re.Match[str] | None:
        return self.compiled().fullmatch(string)

    def search(self, string: str) -> re.Match[str] | None:
        return self.compiled().search(string)

    def finditer(self, string: str) -> Iterator[re.Match[str]]:
        return self.compiled().finditer(string)

    def __repr__(self) -> str:
        return f"Pattern({self.pattern!r}, {self.flags!r})"
