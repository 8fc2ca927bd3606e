"""An intelligence whose endpoints a reload may replace: :class:`SwappableIntelligence`.

Why a wrapper: a run's loop and a daemon's wakes hold the intelligence they were given for their whole life.
A reload (agentd.ctl) opens a client for the new endpoints beside the running one (:meth:`stage`; a bad
endpoint or token raises there and nothing changes) and swaps it in (:meth:`commit`): the next model call
goes to the new endpoints, a call in flight finishes on the old client, which closes once no call uses it
(bounded by :data:`RETIRE_WAIT`). Every client is held open by a task in the wrapper's own nursery
(:func:`open_swappable`), so it closes in the task that opened it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final

import trio

from agentd.intelligence import CALL_TIMEOUT, Intelligence, release_idle
from agentd.intelligence.wire import ChatTool, ModelReply, Usage

#: How long a replaced client waits for its calls in flight before it closes (one call's own bound, plus retries).
RETIRE_WAIT: Final = 2 * CALL_TIMEOUT

#: Opens one intelligence client for as long as its block runs (``agentd.intelligence.open_intelligence``).
Opener = Callable[[], AbstractAsyncContextManager[Intelligence]]


class Held:
    """One opened client: its calls in flight, and the event that tells its holder to close it once idle.
    (A plain class: a once run builds it at start-up, where an attrs class costs about a millisecond of CPU.)"""

    __slots__ = ("_idle", "calls", "intel", "retired")

    def __init__(self, intel: Intelligence) -> None:
        self.intel = intel
        self.retired = trio.Event()
        self.calls = 0
        self._idle = trio.Event()

    def done(self) -> None:
        self.calls -= 1
        if not self.calls:
            self._idle.set()
            self._idle = trio.Event()

    async def wait_idle(self) -> None:
        while self.calls:
            await self._idle.wait()


class SwappableIntelligence:
    """The :class:`~agentd.intelligence.Intelligence` of a run under an operator: the current client, swappable.
    (A plain class: a once run builds it at start-up, where an attrs class costs about a millisecond of CPU.)"""

    __slots__ = ("_current", "_held", "_nursery", "_used", "usage")

    def __init__(self, current: Held, nursery: trio.Nursery, held: list[Held], used: list[Intelligence]) -> None:
        self._current = current
        self._nursery = nursery
        self._held = held
        #: Every client this run used, in order (``usage`` counts every reply any of them produced).
        self._used = used
        self.usage = Usage()

    @property
    def model(self) -> str:
        return self._current.intel.model

    @model.setter
    def model(self, value: str) -> None:
        self._current.intel.model = value

    async def complete(self, messages: list[dict[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        generation = self._current
        generation.calls += 1
        try:
            return await generation.intel.complete(messages, tools)
        finally:
            generation.done()
            self.usage = sum((intel.usage for intel in self._used), Usage())

    async def release_idle(self) -> None:
        """The current client lets go of its idle connections (agentd.intelligence.release_idle)."""
        await release_idle(self._current.intel)

    async def stage(self, opener: Opener) -> Held:
        """Open the next client (raises what opening raises: a bad endpoint, an unresolvable token)."""
        staged: Held = await self._nursery.start(_hold, opener)
        self._held.append(staged)
        return staged

    def commit(self, staged: Held) -> None:
        """From the next call on, ``staged`` answers; the replaced client closes once its calls finished."""
        old, self._current = self._current, staged
        self._used.append(staged.intel)
        self._retire(old)

    def discard(self, staged: Held) -> None:
        self._retire(staged)

    def _retire(self, generation: Held) -> None:
        generation.retired.set()
        if generation in self._held:
            self._held.remove(generation)

    def close(self) -> None:
        for generation in list(self._held):
            self._retire(generation)


async def _hold(opener: Opener, *, task_status: trio.TaskStatus[Held]) -> None:
    """Hold one client open until it is retired and idle (its calls in flight get :data:`RETIRE_WAIT`)."""
    async with opener() as intel:
        held = Held(intel)
        task_status.started(held)
        await held.retired.wait()
        with trio.move_on_after(RETIRE_WAIT):
            await held.wait_idle()


@asynccontextmanager
async def open_swappable(opener: Opener) -> AsyncIterator[SwappableIntelligence]:
    """Open the first client with ``opener`` and hold it (and every later one) while the block runs."""
    async with trio.open_nursery() as nursery:
        first: Held = await nursery.start(_hold, opener)
        intel = SwappableIntelligence(first, nursery, [first], [first.intel])
        try:
            yield intel
        finally:
            intel.close()


__all__ = ["RETIRE_WAIT", "Held", "Opener", "SwappableIntelligence", "open_swappable"]
