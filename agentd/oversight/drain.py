"""The drain latch: how "please stop" (SIGTERM, SIGINT, an operator) reaches the daemon.

The CLI owns the process's signals. The first SIGTERM/SIGINT *requests a drain*: the latch is set, the
daemon stops taking new work and lets running work finish; after ``--drain-timeout`` (plus the kill
ladder's graces) the CLI cancels whatever is left, and the process exits 0 (a clean drain is success, as in
the original agentd). A second signal forces: the run scope is cancelled at once (exit 1).

The latch travels in a context variable, so the daemon finds it with :func:`current_drain` without a
parameter on ``agentd.main(cfg)``, and two runs in one process (each with its own latch) do not interfere.
A library caller that installs none gets a latch that never fires.
"""

from __future__ import annotations

import contextlib
import functools
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Generic, TypeVar

import attrs
import trio

from agentd.telemetry.events import EventLog


class DrainLatch:
    """Set once; every waiter wakes. ``reason`` says why (``SIGTERM``, ``SIGINT``, ``operator``...).
    (A plain class: a once run builds it at start-up, where an attrs class costs about a millisecond of CPU.)"""

    __slots__ = ("_event", "reason", "spent", "subagents")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.reason: str | None = None
        #: What the runs cut by the drain's end had spent themselves: ``(steps, prompt_tokens,
        #: completion_tokens, estimated_tokens)``, summed; the CLI's "cancelled" document reports it (None: no
        #: run was cut).
        self.spent: tuple[int, int, int, int] | None = None
        #: What their subagents had spent: ``(prompt_tokens, completion_tokens, estimated_tokens)`` (None: none).
        self.subagents: tuple[int, int, int] | None = None

    def note_spent(self, steps: int, prompt_tokens: int, completion_tokens: int, estimated_tokens: int = 0) -> None:
        """A run was cancelled while draining: count what it had really spent (its cut reply's too)."""
        s, p, c, e = self.spent or (0, 0, 0, 0)
        self.spent = (s + steps, p + prompt_tokens, c + completion_tokens, e + estimated_tokens)

    def note_subagents(self, prompt_tokens: int, completion_tokens: int, estimated_tokens: int = 0) -> None:
        """The subagents of a run cancelled while draining had spent this."""
        if prompt_tokens or completion_tokens:
            p, c, e = self.subagents or (0, 0, 0)
            self.subagents = (p + prompt_tokens, c + completion_tokens, e + estimated_tokens)

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @property
    def event(self) -> trio.Event:
        """The underlying event, for code that waits on (or sets) a plain ``trio.Event``."""
        return self._event

    def request(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


_CURRENT: ContextVar[DrainLatch | None] = ContextVar("agentd_drain_latch", default=None)


def current_drain() -> DrainLatch:
    """The latch of the current run (installed by the CLI or :func:`use_drain`), or a latch nobody sets."""
    latch = _CURRENT.get()
    return latch if latch is not None else DrainLatch()


def installed_drain() -> DrainLatch | None:
    """The installed latch, or None: then nobody owns the signals and a daemon may watch them itself."""
    return _CURRENT.get()


@contextlib.contextmanager
def use_drain(latch: DrainLatch) -> Iterator[DrainLatch]:
    """Install ``latch`` for the current task and the tasks it starts from here on."""
    token = _CURRENT.set(latch)
    try:
        yield latch
    finally:
        _CURRENT.reset(token)


async def watch_signals(
    latch: DrainLatch,
    force: Callable[[], None],
    *,
    log: EventLog,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Turn SIGTERM/SIGINT into a drain request, and a second one into ``force()``. Runs until cancelled."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            name = signal.Signals(signum).name
            if not latch.requested:
                log.warn("proc.signal", signal=name, action="drain")
                latch.request(name)
            else:
                log.warn("proc.signal", signal=name, action="force")
                force()


T = TypeVar("T")


@attrs.frozen
class SignalledRun(Generic[T]):
    """How a run under :func:`run_with_signals` ended: its result (None if it was cancelled), and whether a
    drain was requested and a second signal forced the end."""

    result: T | None
    drained: bool
    forced: bool
    #: The latch's :attr:`DrainLatch.spent` (what the runs cut by the drain had spent) and
    #: :attr:`DrainLatch.subagents` (what their subagents had).
    spent: tuple[int, int, int, int] | None = None
    subagents: tuple[int, int, int] | None = None


async def run_with_signals(
    main: Callable[[], Awaitable[T]], *, drain_timeout: float, log: EventLog
) -> SignalledRun[T]:
    """Run ``main()`` owning SIGTERM/SIGINT the way every agentd command does: the first signal sets a fresh
    latch (installed for ``main``), ``drain_timeout`` seconds later the run is cancelled, a second signal
    cancels it at once. The cancellation itself walks the kill ladder and the services' shielded, bounded
    cleanup (unsubscribe, DELETE), so nothing is orphaned."""
    latch = DrainLatch()
    run_scope = trio.CancelScope()
    forced = False

    def force() -> None:
        nonlocal forced
        forced = True
        run_scope.cancel()

    async def backstop() -> None:
        await latch.wait()
        await trio.sleep(drain_timeout)
        log.warn("drain.end", outcome="cancelled", drain_timeout=drain_timeout)
        run_scope.cancel()

    result: T | None = None
    with use_drain(latch):
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(watch_signals, latch, force, log=log))
            nursery.start_soon(backstop)
            with run_scope:
                result = await main()
            nursery.cancel_scope.cancel()
    return SignalledRun(result, drained=latch.requested, forced=forced, spent=latch.spent,
                        subagents=latch.subagents)
