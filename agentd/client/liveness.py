"""Whether a connection is up, and which one: the one piece of state its exchange, push streams and
lifecycle all read.

A connection is *connected* between a completed handshake and the first sign that it is gone. That sign
(a transport failure, a 404 on the session, stale pings, a dropped stream) comes from whichever part sees
it first: each one calls :meth:`Liveness.mark_broken`, and the live phase, waiting on :attr:`broken`,
tears down. Every completed (re)connect bumps :attr:`generation`, so a request that found the session
gone can wait for a newer one.
"""

from __future__ import annotations

import attrs
import trio


@attrs.define(eq=False)
class Liveness:
    connected: bool = False
    #: How many handshakes have completed; a request remembers the one it was sent on.
    generation: int = 0
    broken: trio.Event = attrs.field(factory=trio.Event)
    broken_reason: str = ""
    _reconnected: trio.Event = attrs.field(factory=trio.Event)

    def mark_broken(self, reason: str) -> None:
        """The connection is gone (the first reason wins; nothing happens while not connected)."""
        if self.connected and not self.broken.is_set():
            self.broken_reason = reason
            self.broken.set()

    def connecting(self) -> None:
        """A new attempt starts: forget the last break."""
        self.broken = trio.Event()

    def up(self) -> None:
        """A handshake completed: a new generation is connected; wake whoever waited for it."""
        self.connected = True
        self.generation += 1
        reconnected, self._reconnected = self._reconnected, trio.Event()
        reconnected.set()

    def down(self) -> None:
        """The live phase ended (broken, or the connection is closing)."""
        self.connected = False

    async def wait_reconnected(self, generation: int) -> None:
        """Wait until a connection newer than ``generation`` is up (the caller bounds the wait)."""
        while self.generation <= generation or not self.connected:
            await self._reconnected.wait()
