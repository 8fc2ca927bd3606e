"""The wake budget: how many wakes one URI, and the whole daemon, may start per minute.

The router coalesces a burst into one running and one pending wake per URI, but a server that changes a
resource (or only says it did) thousands of times a second still earns a wake every ``--debounce``
window, each an agent run that costs tokens. This budget puts a ceiling on that spend: at most
``per_uri`` wakes per URI and ``per_daemon`` wakes in all within any 60 s (a sliding window; 0 = no
limit for that scope). A wake over budget is not dropped: the router keeps it pending (later updates
fold into it) and asks again when :meth:`WakeBudget.check` says, so the latest state is still read
once the budget allows.

Pure bookkeeping over the ``now`` the caller passes (trio time in the router), tested with a virtual
clock; the router decides how to wait.
"""

from __future__ import annotations

import collections
import math
from typing import Final

import attrs

#: The sliding window the budgets count over (seconds).
WINDOW: Final = 60.0


@attrs.frozen
class WakeDecision:
    """``allowed``: start the wake now (and it was counted). Else wait ``wait`` seconds and ask again;
    ``scope`` says which budget is spent (``uri`` or ``daemon``)."""

    allowed: bool
    wait: float = 0.0
    scope: str | None = None


@attrs.define(eq=False)
class WakeBudget:
    per_uri: int = 0
    per_daemon: int = 0
    window: float = WINDOW
    _all: collections.deque[float] = attrs.field(factory=collections.deque, init=False)
    _by_uri: dict[str, collections.deque[float]] = attrs.field(factory=dict, init=False)
    _swept: float = attrs.field(default=-math.inf, init=False)

    def check(self, uri: str, now: float) -> WakeDecision:
        """May a wake for ``uri`` start at ``now``? An allowed wake is counted against both budgets."""
        self._expire(now)
        starts = self._by_uri.get(uri)
        horizon = now - self.window
        while starts and starts[0] <= horizon:
            starts.popleft()
        if self.per_uri > 0 and starts is not None and len(starts) >= self.per_uri:
            return WakeDecision(False, starts[0] + self.window - now, "uri")
        if self.per_daemon > 0 and len(self._all) >= self.per_daemon:
            return WakeDecision(False, self._all[0] + self.window - now, "daemon")
        if self.per_uri > 0 or self.per_daemon > 0:
            self._all.append(now)
            self._by_uri.setdefault(uri, collections.deque()).append(now)
        return WakeDecision(True)

    def _expire(self, now: float) -> None:
        """Forget starts older than the window: the daemon's, and every URI's once per window (a sweep over
        all URIs on every check would cost each wake time in proportion to the URIs watched)."""
        horizon = now - self.window
        while self._all and self._all[0] <= horizon:
            self._all.popleft()
        if now - self._swept < self.window:
            return
        self._swept = now
        for uri, starts in list(self._by_uri.items()):
            while starts and starts[0] <= horizon:
                starts.popleft()
            if not starts:
                del self._by_uri[uri]
