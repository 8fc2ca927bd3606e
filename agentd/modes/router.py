"""The reactive router: turns a stream of ``resources/updated`` URIs into bounded, coalesced wakes.

Per URI there is at most one wake running and one pending. An update for an idle URI wakes at once
(the leading edge, so a lone change is handled within milliseconds); updates that arrive while a
wake is running, or within ``debounce`` seconds of the previous wake's start, fold into the single
pending follow-up, which starts when both the running wake has ended and the window has passed.
The pending flag is cleared *before* the wake reads the resource, so an update that lands after
the read began always earns one more wake: after any burst the last wake reads the final state
(level, not edge). Different URIs are independent, bounded together by ``max_concurrent`` wakes.

A saturated router batches: with ``batch`` > 1, a wake that gets one of the ``max_concurrent``
slots takes along up to ``batch - 1`` other URIs that are due and waiting for a slot (oldest first),
and the daemon reads them all and runs once on all of them. Under light load every URI still wakes
alone on its leading edge; under a steady stream over many URIs the daemon keeps up by running
fewer, wider wakes instead of queueing one run per URI behind the slots. A URI taken along is
running for that wake (never two wakes of one URI at once) and its later updates fold into its
own pending follow-up as usual.

On top, a :class:`~agentd.modes.wake_budget.WakeBudget` bounds wakes per URI and per daemon per
minute: a wake over budget stays pending (updates keep folding into it) and starts when the budget
allows, so it is delayed and coalesced, never lost.

The router does not read resources or run agents itself: it calls ``wake(Wake)``, and a failing
wake is logged and does not stop the router (``on_done`` hears about every outcome, so the daemon's
restart governor can count failures).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import attrs
import trio

from agentd import defaults
from agentd.modes.wake_budget import WakeBudget
from agentd.telemetry.events import EventLog, null_log


@attrs.frozen
class Wake:
    """One wake for ``uri``: ``seq`` numbers wakes across the router, ``updates`` counts what it folds."""

    uri: str
    server: str | None
    seq: int
    updates: int
    #: trio time of the earliest update this wake answers (for latency accounting).
    first_update_at: float
    #: Other URIs this wake covers (a saturated router with ``batch`` > 1), with their own counts.
    also: tuple[Wake, ...] = ()

    @property
    def items(self) -> tuple[Wake, ...]:
        """Every URI this wake reads, this one first."""
        return (self, *self.also)


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
    #: While waiting for a wake slot: the scope a batching wake cancels when it takes this URI along.
    queued: trio.CancelScope | None = None
    #: Set when this URI was taken along by another wake; fires when that wake ends.
    riding: trio.Event | None = None


@attrs.define(eq=False)
class RouterStats:
    updates: int = 0
    wakes: int = 0
    failed: int = 0
    dropped: int = 0
    throttled: int = 0
    #: URIs read by a wake started for another URI (``batch`` > 1); ``wakes`` counts runs.
    batched: int = 0


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
    #: URIs one wake may cover when wakes queue for slots (1: every wake is one URI).
    batch: int = 1
    _slots: dict[str, _Slot] = attrs.field(factory=dict, init=False)
    #: Bounded URIs waiting for a wake slot, oldest first (what a batching wake takes along).
    _queued: dict[str, _Slot] = attrs.field(factory=dict, init=False)
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
        """Own the per-URI tasks; runs until cancelled (drain first with :meth:`close`).

        Updates arrive on the MCP connections' own tasks (agentd.modes.watch), which may outlive this one:
        once it is ending, a late update is counted as dropped instead of meeting a closed nursery.
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

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
                limiter = self._limiter if self.bounded(uri) else None
                if not await self._take_slot(uri, slot, limiter):
                    riding = slot.riding
                    assert riding is not None
                    await riding.wait()  # taken along by another wake: it read this URI; fold in as usual
                    slot.riding = None
                    continue
                try:
                    if not self._wanted(slot):  # closed while waiting for a slot
                        break
                    self._seq += 1
                    riders = self._take_along(limiter)
                    now = trio.current_time()
                    also = tuple(self._start(other, rider, now) for other, rider in riders)
                    wake = self._start(uri, slot, now, also)
                    self.stats.wakes += 1
                    self.stats.batched += len(also)
                    try:
                        await self._one(wake)
                    finally:
                        slot.running = False
                        for _, rider in riders:
                            rider.running = False
                            if rider.riding is not None:
                                rider.riding.set()
                finally:
                    if limiter is not None:
                        limiter.release()
        finally:
            slot.running = False
            if self._slots.get(uri) is slot:
                del self._slots[uri]
            if not self._slots:
                self._idle.set()

    def _wanted(self, slot: _Slot) -> bool:
        return slot.pending and not self._closed

    async def _take_slot(self, uri: str, slot: _Slot, limiter: trio.CapacityLimiter | None) -> bool:
        """One of the ``max_concurrent`` wake slots (none for an unbounded URI); False when another wake
        took this URI along while it waited (then no slot is held).

        A free slot is taken without a scheduling round (``async with limiter`` always yields): on the
        leading edge a wake should reach its read at once, not after every other ready task has run.
        """
        if limiter is None:
            return True
        try:
            limiter.acquire_nowait()
            return True
        except trio.WouldBlock:
            pass
        acquired = False
        with trio.CancelScope() as slot.queued:
            self._queued[uri] = slot
            try:
                await limiter.acquire()
                acquired = True
            finally:
                slot.queued = None
                if self._queued.get(uri) is slot:
                    del self._queued[uri]
        if slot.riding is None:
            return True
        if acquired:  # granted a slot just as another wake took it along: that wake reads it
            limiter.release()
        return False

    def _take_along(self, limiter: trio.CapacityLimiter | None) -> list[tuple[str, _Slot]]:
        """Up to ``batch - 1`` due URIs waiting for a slot, oldest first (bounded wakes only)."""
        riders: list[tuple[str, _Slot]] = []
        if limiter is None or self.batch <= 1:
            return riders
        for uri, slot in list(self._queued.items()):
            if len(riders) >= self.batch - 1:
                break
            if not self._wanted(slot) or slot.running or slot.queued is None:
                continue
            del self._queued[uri]
            slot.riding = trio.Event()
            slot.queued.cancel()
            riders.append((uri, slot))
        return riders

    def _start(self, uri: str, slot: _Slot, now: float, also: tuple[Wake, ...] = ()) -> Wake:
        wake = Wake(uri, slot.server, self._seq, slot.updates, slot.first_update_at, also)
        # Cleared before the wake reads, so any later update earns one more wake.
        slot.pending, slot.updates, slot.running = False, 0, True
        slot.last_start = now
        return wake

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
