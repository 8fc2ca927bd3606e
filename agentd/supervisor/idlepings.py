"""One timer for all of a supervisor's idle warm sessions: their pings go out in rounds, not from a task each.

Why: an idle warm session is pinged every ``idle_ping_interval`` (the parent's CPU, per child). A sleeping
task per child paid, per ping, a wake-up from a deadline (a cancel scope and an exception), a second scope
around the send, the channel's lock and the stream's checkpoint (a loop pass each), and the pongs came
back one per loop pass. Here one task sleeps until the earliest due ping and, in one step, pings every idle
session due within ``COALESCE`` of the interval from now, so sessions fall into a few groups pinged
together whose pongs are read together. Each ping is a plain write to the child's pipe when that cannot
block (:meth:`ControlChannel.send_nowait`), else a bounded send in a task of its own.

The rule is the node's (:meth:`agentd.supervisor.node.SubagentNode.idle_round`, over
:class:`agentd.supervisor.liveness.Liveness`): before each ping the session's verdict is taken, so a session
that left a ping unanswered for ``pong_timeout`` is stuck at its next round, as with its own pinger. A session
leaves the timer when its next turn starts (its own pinger pings at the working pace again) or it ends.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Protocol

import attrs
import trio

#: A round also pings the sessions due within this fraction of the interval from now (at most once early:
#: they are then due together).
COALESCE = 0.1


class IdleSession(Protocol):
    def idle_round(self, now: float, ticket: int) -> bool:
        """Ping now if ``ticket`` is still the session's; False when it leaves the timer (stuck, busy, ended)."""
        ...


@attrs.define(eq=False)
class IdlePings:
    #: Where the timer task runs (started with the first session, cancelled by :meth:`close`); any slow send
    #: a session falls back to runs there too.
    nursery: trio.Nursery
    #: (due, order, ticket, interval, session), earliest first.
    _heap: list[tuple[float, int, int, float, IdleSession]] = attrs.field(init=False, factory=list)
    _order: itertools.count[int] = attrs.field(init=False, factory=itertools.count)
    _sleep: trio.CancelScope | None = attrs.field(init=False, default=None)
    _task: trio.CancelScope | None = attrs.field(init=False, default=None)
    _closed: bool = attrs.field(init=False, default=False)
    #: Rounds so far: one task step each, however many sessions it pings.
    rounds: int = attrs.field(init=False, default=0)

    def add(self, session: IdleSession, ticket: int, interval: float) -> None:
        """Ping ``session`` every ``interval`` from now while ``ticket`` is its current one."""
        if self._closed:
            return
        due = trio.current_time() + interval
        heapq.heappush(self._heap, (due, next(self._order), ticket, interval, session))
        if self._task is None:
            self._task = trio.CancelScope()
            self.nursery.start_soon(self._run, self._task)
        elif self._sleep is not None and due < self._sleep.deadline:
            self._sleep.deadline = due

    def close(self) -> None:
        """Stop the timer for good (its supervisor is ending)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self._heap.clear()

    async def _run(self, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                with trio.CancelScope(deadline=self._heap[0][0] if self._heap else math.inf) as self._sleep:
                    await trio.sleep_forever()
                self._sleep = None
                now = trio.current_time()
                heap = self._heap
                if not heap or heap[0][0] > now:
                    continue
                self.rounds += 1
                due = []
                # The sessions due soon after join this round: the groups stay few, and stay together after.
                while heap and heap[0][0] <= now + COALESCE * heap[0][3]:
                    due.append(heapq.heappop(heap))
                for _, _, ticket, interval, session in due:
                    if session.idle_round(now, ticket):
                        heapq.heappush(heap, (now + interval, next(self._order), ticket, interval, session))
