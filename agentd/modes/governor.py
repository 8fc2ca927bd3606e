"""The restart governor and the lifetime token budget shared by the daemon modes.

A daemon that re-runs a failing agent back to back burns tokens and hammers its peers, so every
daemon fire (a loop iteration, a scheduled run, a wake) reports its outcome here. Failures back off
exponentially (500 ms doubling to 30 s, reset by a success); more than five failures within 60 s
open the breaker, which ends the daemon with exit 1 instead of failing forever.

Both classes are pure bookkeeping over timestamps the caller passes in, so they are tested without
a clock and the drivers decide how to sleep.
"""

from __future__ import annotations

import collections
from typing import Final

import attrs

from agentd.backoff import exponential

BACKOFF_BASE: Final = 0.5
BACKOFF_CAP: Final = 30.0
BREAKER_WINDOW: Final = 60.0
BREAKER_THRESHOLD: Final = 5


@attrs.frozen
class Verdict:
    """What the governor says after a failure: wait ``backoff`` seconds, or stop if ``breaker_open``."""

    backoff: float
    breaker_open: bool
    failures_in_window: int


@attrs.define(eq=False)
class RestartGovernor:
    base: float = BACKOFF_BASE
    cap: float = BACKOFF_CAP
    window: float = BREAKER_WINDOW
    threshold: int = BREAKER_THRESHOLD
    _recent: collections.deque[float] = attrs.field(factory=collections.deque, init=False)
    _consecutive: int = attrs.field(default=0, init=False)

    def success(self) -> None:
        """A run finished well: the next failure starts the backoff from the bottom again."""
        self._consecutive = 0

    def failure(self, now: float, *, weight: int = 1) -> Verdict:
        """Record a failed run at ``now`` (seconds on any monotonic clock); ``weight`` counts it n times."""
        for _ in range(weight):
            self._recent.append(now)
        while self._recent and self._recent[0] <= now - self.window:
            self._recent.popleft()
        self._consecutive += 1
        backoff = exponential(self._consecutive, self.base, self.cap)
        return Verdict(backoff, len(self._recent) > self.threshold, len(self._recent))

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive


@attrs.define(eq=False)
class LifetimeBudget:
    """Tokens this daemon may spend over its whole life (``--budget-tokens-lifetime``; 0 = unbounded)."""

    limit: int = 0
    spent: int = 0

    def charge(self, tokens: int) -> None:
        self.spent += max(0, tokens)

    @property
    def exhausted(self) -> bool:
        return self.limit > 0 and self.spent >= self.limit

    def remaining(self) -> int | None:
        """Tokens left, or None when unbounded; a run's own token cap is clipped to this."""
        if self.limit <= 0:
            return None
        return max(0, self.limit - self.spent)

    def clip(self, per_run: int) -> int:
        left = self.remaining()
        return per_run if left is None else min(per_run, left)
