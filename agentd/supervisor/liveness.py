"""Liveness of a child, as pure arithmetic over a clock: is it answering pings, is it making progress?

The parent pings every ``ping_interval``; a pong missing for ``pong_timeout`` or no progress (any frame
but a pong) for ``progress_timeout`` while a turn is running marks the child stuck, which starts the
kill ladder. An idle warm session is only held to the pong rule: waiting for a message is not stalling.
"""

from __future__ import annotations

import attrs

from agentd import defaults


@attrs.frozen
class LivenessSettings:
    ping_interval: float = 3.3
    pong_timeout: float = defaults.PONG_TIMEOUT
    progress_timeout: float = defaults.PROGRESS_TIMEOUT


@attrs.define(eq=False)
class Liveness:
    settings: LivenessSettings
    last_pong: float
    last_progress: float
    working: bool = True

    @classmethod
    def starting_at(cls, settings: LivenessSettings, now: float) -> Liveness:
        return cls(settings, last_pong=now, last_progress=now)

    def pong(self, now: float) -> None:
        self.last_pong = now

    def progress(self, now: float) -> None:
        self.last_progress = now

    def turn_started(self, now: float) -> None:
        self.working = True
        self.last_progress = now

    def turn_finished(self, now: float) -> None:
        self.working = False
        self.last_progress = now

    def verdict(self, now: float) -> str | None:
        """None while healthy, else why the child is stuck."""
        if now - self.last_pong >= self.settings.pong_timeout:
            return f"stuck: no pong for {self.settings.pong_timeout:g} s"
        if self.working and now - self.last_progress >= self.settings.progress_timeout:
            return f"stuck: no progress for {self.settings.progress_timeout:g} s"
        return None
