"""Liveness of a child, as pure arithmetic over a clock: is it answering pings, is it making progress?

The parent pings every ``ping_interval``; a pong missing for ``pong_timeout`` or no progress (any frame
but a pong) for ``progress_timeout`` while a turn is running marks the child stuck, which starts the
kill ladder. An idle warm session is only held to the pong rule: waiting for a message is not stalling.
It is pinged every ``idle_ping_interval`` instead (pings are the parent's CPU, per child), and must answer
each ping within ``pong_timeout`` of it.
"""

from __future__ import annotations

import attrs

from agentd import defaults


@attrs.frozen
class LivenessSettings:
    ping_interval: float = 3.3
    pong_timeout: float = defaults.PONG_TIMEOUT
    progress_timeout: float = defaults.PROGRESS_TIMEOUT
    idle_ping_interval: float = defaults.IDLE_PING_INTERVAL


class Liveness:
    """One child's clocks. (A plain class: the supervisor modules load at a once run's start-up, where an attrs
    class costs about a millisecond of CPU to build.)"""

    __slots__ = ("last_pong", "last_progress", "pinged", "settings", "working")

    def __init__(self, settings: LivenessSettings, last_pong: float, last_progress: float, working: bool = True,
                 pinged: float | None = None) -> None:
        self.settings = settings
        self.last_pong = last_pong
        self.last_progress = last_progress
        self.working = working
        #: When the oldest unanswered ping was sent (None: every ping answered).
        self.pinged = pinged

    @classmethod
    def starting_at(cls, settings: LivenessSettings, now: float) -> Liveness:
        return cls(settings, last_pong=now, last_progress=now)

    def pong(self, now: float) -> None:
        self.last_pong = now
        self.pinged = None

    def ping_sent(self, now: float) -> None:
        if self.pinged is None:
            self.pinged = now

    def progress(self, now: float) -> None:
        self.last_progress = now

    def turn_started(self, now: float) -> None:
        if not self.working:  # the pong clock restarts with the turn; an unanswered ping still counts
            self.last_pong = now if self.pinged is None else min(now, self.pinged)
        self.working = True
        self.last_progress = now

    def turn_finished(self, now: float) -> None:
        self.working = False
        self.last_progress = now

    def verdict(self, now: float) -> str | None:
        """None while healthy, else why the child is stuck."""
        since = self.last_pong if self.working else self.pinged
        if since is not None and now - since >= self.settings.pong_timeout:
            return f"stuck: no pong for {self.settings.pong_timeout:g} s"
        if self.working and now - self.last_progress >= self.settings.progress_timeout:
            return f"stuck: no progress for {self.settings.progress_timeout:g} s"
        return None
