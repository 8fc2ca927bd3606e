"""The reactive router: turns a stream of ``resources/updated`` URIs into bounded, coalesced wakes.

Per URI there is at most one wake running and one pending. An update for an idle URI wakes at once
(the leading edge, so a lone change is handled within milliseconds); updates that arrive while a
wake is running, or within ``debounce`` seconds of the previous wake's start, fold into the single
pending follow-up, which starts when both the running wake has ended and the window has passed.
The pending flag is cleared *before* the wake reads the resource, so an update that lands after
the read began always earns one more wake: after any burst the last wake reads the final state
(level, not edge). Different URIs are independent, bounded together by ``max_concurrent`` wakes.

On top, a :class:`~agentd.reactive.wake_budget.WakeBudget` bounds wakes per URI and per daemon per
minute: a wake over budget stays pending (updates keep folding into it) and starts when the budget
allows, so it is delayed and coalesced, never lost.

The router does not read resources or run agents itself: it calls ``wake(Wake)``, and a failing
wake is logged and does not stop the router (``on_done`` hears about every outcome, so the daemon's
restart governor can count failures).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs
import trio

from agentd import defaults
from agentd.events import EventLog, null_log
from agentd.reactive.wake_budget import WakeBudget


@contextlib.asynccontextmanager
async def _wake_slot(limiter: trio.CapacityLimiter | None) -> AsyncIterator[None]:
    """One of the ``max_concurrent`` wake slots (none for an unbounded URI).

    A free slot is taken without a scheduling round (``async with limiter`` always yields): on the
    leading edge a wake should reach its read at once, not after every other ready task has run.
    """
    if limiter is None:
        yield
        return
    try:
        limiter.acquire_nowait()
    except trio.WouldBlock:
        await limiter.acquire()
    try:
        yield
    finally:
        limiter.release()


@attrs.frozen
class Wake:
    """One wake for ``uri``: ``seq`` numbers wakes across the router, ``updates`` counts what it folds."""

    uri: str
    server: str | None
    seq: int
    updates: int
    #: trio time of the earliest update this wake answers (for latency accounting).
    first_update_at: float


WakeFn = Callable[[Wake], Awaitable[None]]
DoneFn = Callable[[Wake, BaseException | None], None]


@attrs.define(eq=False)
class _Slot:
    server: str | None
    pending: bool = True
    running: bool = False
    updates: int = 0
    first_update_at: float = 0.0
    last_start: float = -math.inf


@attrs.define(eq=False)
class RouterStats:
    updates: int = 0
    wakes: int = 0
    failed: int = 0
    dropped: int = 0
    throttled: int = 0


@attrs.define(eq=False)
class Router:
    """Run it as a service (``await nursery.start(router.run)``), feed it with :meth:`notify`."""

    wake: WakeFn
    debounce: float = defaults.DEBOUNCE
    max_concurrent: int = defaults.MAX_CONCURRENT_WAKES
    log: EventLog = attrs.field(factory=null_log)
    on_done: DoneFn | None = None
    #: URIs whose wakes count against ``max_concurrent`` (a ``--continue`` route serialises itself instead).
    bounded: Callable[[str], bool] = lambda uri: True
    stats: RouterStats = attrs.field(factory=RouterStats)
    #: Wakes per URI / per daemon per minute (unbounded unless the daemon passes its configured budget).
    budget: WakeBudget = attrs.field(factory=WakeBudget)
    _slots: dict[str, _Slot] = attrs.field(factory=dict, init=False)
    _limiter: trio.CapacityLimiter = attrs.field(init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _idle: trio.Event = attrs.field(factory=trio.Event, init=False)
    _closing: trio.Event = attrs.field(factory=trio.Event, init=False)
    _seq: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(max(1, self.max_concurrent))
        self._idle.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the per-URI tasks; runs until cancelled (drain first with :meth:`close`)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def notify(self, uri: str, server: str | None = None) -> None:
        """An update for ``uri`` arrived. Never blocks; folds into a pending wake when there is one."""
        self.stats.updates += 1
        if self._closed or self._nursery is None:
            self.stats.dropped += 1
            return
        slot = self._slots.get(uri)
        if slot is None:
            if not self._slots:
                self._idle = trio.Event()
            slot = self._slots[uri] = _Slot(server, first_update_at=trio.current_time())
            self._nursery.start_soon(self._drive, uri, slot)
        elif not slot.pending:
            slot.pending = True
            slot.first_update_at = trio.current_time()
        if server is not None:
            slot.server = server
        slot.updates += 1

    def close(self) -> None:
        """Stop taking wakes: pending ones are dropped, running ones go on (drain waits for them)."""
        self._closed = True
        self._closing.set()
        for slot in self._slots.values():
            if slot.pending:
                slot.pending = False
                self.stats.dropped += 1

    async def wait_idle(self) -> None:
        """Return once no wake is running or pending."""
        await self._idle.wait()

    @property
    def running(self) -> list[str]:
        return [uri for uri, slot in self._slots.items() if slot.running]

    @property
    def pending(self) -> list[str]:
        return [uri for uri, slot in self._slots.items() if slot.pending]

    async def _drive(self, uri: str, slot: _Slot) -> None:
        try:
            while self._wanted(slot):
                delay = slot.last_start + self.debounce - trio.current_time()
                if delay > 0:
                    await trio.sleep(delay)
                decision = self.budget.check(uri, trio.current_time())
                if not decision.allowed:
                    # Over budget: stay pending (later updates fold in) and ask again when it allows.
                    self.stats.throttled += 1
                    self.log.warn("reactive.throttled", uri=uri, scope=decision.scope,
                                  wait_s=round(decision.wait, 3), updates=slot.updates)  # fmt: skip
                    with trio.move_on_after(max(decision.wait, 0.0)):
                        await self._closing.wait()  # a drain does not wait out the budget
                    continue
                async with _wake_slot(self._limiter if self.bounded(uri) else None):
                    if not self._wanted(slot):  # closed while waiting for a slot
                        break
                    self._seq += 1
                    wake = Wake(uri, slot.server, self._seq, slot.updates, slot.first_update_at)
                    # Cleared before the wake reads, so any later update earns one more wake.
                    slot.pending, slot.updates, slot.running = False, 0, True
                    slot.last_start = trio.current_time()
                    self.stats.wakes += 1
                    await self._one(wake)
                    slot.running = False
        finally:
            slot.running = False
            if self._slots.get(uri) is slot:
                del self._slots[uri]
            if not self._slots:
                self._idle.set()

    def _wanted(self, slot: _Slot) -> bool:
        return slot.pending and not self._closed

    async def _one(self, wake: Wake) -> None:
        error: BaseException | None = None
        try:
            await self.wake(wake)
        except Exception as exc:  # a failed wake is an event, never the daemon's end
            error = exc
            self.stats.failed += 1
            self.log.error("reactive.wake_failed", uri=wake.uri, seq=wake.seq, error=type(exc).__name__,
                           message=str(exc))
        if self.on_done is not None:
            self.on_done(wake, error)
