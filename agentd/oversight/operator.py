"""The operator's switches, consulted where work starts: :class:`Operator`.

Why one object in a context variable (like the drain latch): the loop, the daemon modes and readiness all
need it, and threading a parameter through every layer for a switch most runs never see would widen every
signature. A daemon installs one (:func:`use_operator`); a process without one (a subagent, a library
caller) pays one ``None`` test per step.

- **pause**: no new turn starts. The loop waits at its next turn boundary (before asking the model again);
  model and tool calls in flight finish. A drain ends the wait (the run stops as drained).
- **lame duck**: nothing new starts: a daemon mode holds new runs (wakes, fires, self-scheduled runs) until
  the lame duck ends or the daemon drains; the supervisor refuses served spawns; readiness is false. What
  runs keeps running.
- **cancel**: each run registers its cancel scope while its loop runs (:meth:`Operator.running`); cancelling
  it ends the run ``cancelled`` at once (calls in flight are cancelled; the journal records the end).
- **reload**: a part that opened connections registers a stager (:meth:`Operator.staging`): it opens what
  the new config needs beside what runs, and may raise (then every stage is discarded, nothing changed);
  the parts that only switch a value register an applier (:meth:`Operator.reloadable`). Stages commit
  first, then the appliers run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any, Protocol

import trio

from agentd.oversight.drain import DrainLatch


class Staged(Protocol):
    """What a stager opened for a reload: committed (cannot fail) or discarded as a whole."""

    def summary(self) -> dict[str, Any]: ...
    async def commit(self) -> None: ...
    def discard(self) -> None: ...


#: Opens what a reload needs, ``(old_config, new_config)``; None when nothing of its part changed.
Stager = Callable[[Any, Any], Awaitable[Staged | None]]


class RunEntry:
    """A run whose loop is running: its scope (to cancel it) and what ``status`` shows of it. (A plain class: a once run builds it at start-up, where an attrs class costs about a millisecond of CPU.)"""

    __slots__ = ("cancel_reason", "paused", "run_id", "scope", "started_at", "step", "turns")

    def __init__(self, run_id: str, scope: trio.CancelScope, started_at: float) -> None:
        self.run_id = run_id
        self.scope = scope
        self.started_at = started_at
        self.step = 0
        self.paused = False
        self.cancel_reason: str | None = None
        #: Turn boundaries this run has passed (:meth:`Operator.turns_passed` waits on it).
        self.turns = 0

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "step": self.step, "paused": self.paused,
                "running_s": round(time.time() - self.started_at, 3)}


class Operator:
    """The switches (see the module docstring). Every change wakes every waiter (:meth:`changed`).
    (A plain class: a once run builds it at start-up, where an attrs class costs about a millisecond of CPU.)"""

    __slots__ = ("_changed", "_runs", "_turned", "appliers", "held", "lame_duck", "on_change", "paused", "stagers")

    def __init__(self, paused: bool = False, lame_duck: bool = False, held: int = 0) -> None:
        self.paused = paused
        self.lame_duck = lame_duck
        #: New runs a lame duck is holding right now (:meth:`admit`).
        self.held = held
        self._changed = trio.Event()
        self._runs: dict[str, RunEntry] = {}
        #: Set (and replaced) whenever a run passes a turn boundary or ends.
        self._turned = trio.Event()
        #: Called on every switch change (the supervisor follows the lame duck).
        self.on_change: list[Callable[[Operator], None]] = []
        #: What a reload calls, ``(old, new)``, registered by the parts that run (:meth:`reloadable`).
        self.appliers: list[Callable[[Any, Any], Awaitable[None]]] = []
        #: What a reload stages before any applier runs (:meth:`staging`).
        self.stagers: list[Stager] = []

    # -- switches --------------------------------------------------------------------------------------

    def set_paused(self, paused: bool) -> int:
        """Pause or resume; returns how many runs are in flight (the ones the change affects)."""
        self.paused = paused
        self._notify()
        return len(self._runs)

    def set_lame_duck(self, on: bool) -> None:
        self.lame_duck = on
        self._notify()

    def poke(self) -> None:
        """Wake every waiter to re-check (a drain started)."""
        self._changed.set()
        self._changed = trio.Event()

    def _notify(self) -> None:
        for hook in list(self.on_change):
            hook(self)
        self.poke()

    async def changed(self) -> None:
        await self._changed.wait()

    @contextlib.contextmanager
    def reloadable(self, apply: Callable[[Any, Any], Awaitable[None]]) -> Iterator[None]:
        """Have a reload call ``apply(old_config, new_config)`` while the block runs."""
        self.appliers.append(apply)
        try:
            yield
        finally:
            self.appliers.remove(apply)

    @contextlib.contextmanager
    def staging(self, stage: Stager) -> Iterator[None]:
        """Have a reload call ``stage(old_config, new_config)`` while the block runs."""
        self.stagers.append(stage)
        try:
            yield
        finally:
            self.stagers.remove(stage)

    # -- runs ------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def running(self, run_id: str) -> Iterator[RunEntry]:
        """Register ``run_id``'s loop while the block runs; :meth:`cancel` cancels the entry's scope."""
        entry = RunEntry(run_id, trio.CancelScope(), time.time())
        self._runs[run_id] = entry
        try:
            with entry.scope:
                yield entry
        finally:
            if self._runs.get(run_id) is entry:
                del self._runs[run_id]
            self._turn()

    def runs(self) -> list[RunEntry]:
        return list(self._runs.values())

    def cancel(self, run_id: str, reason: str) -> bool:
        entry = self._runs.get(run_id)
        if entry is None:
            return False
        entry.cancel_reason = reason
        entry.scope.cancel()
        return True

    async def turn_boundary(self, entry: RunEntry, drain: DrainLatch) -> None:
        """Wait here while paused (a drain or a resume ends the wait). Unbounded by itself: the run's
        deadline bounds it, and the operator decides when to resume."""
        entry.turns += 1
        self._turn()
        if not self.paused or drain.requested:
            return
        entry.paused = True
        try:
            while self.paused and not drain.requested:
                await self._changed_or(drain)
        finally:
            entry.paused = False

    def _turn(self) -> None:
        turned, self._turned = self._turned, trio.Event()
        turned.set()

    async def turns_passed(self) -> None:
        """Wait until every run in flight now has started its next turn or ended (what a reload swapped out is
        then no longer used by any turn). Unbounded by itself: the caller bounds it."""
        waiting = [(entry, entry.turns) for entry in self._runs.values()]
        while any(entry.turns == turns and self._runs.get(entry.run_id) is entry for entry, turns in waiting):
            await self._turned.wait()

    async def admit(self, accepting: Callable[[], bool], drain: DrainLatch | None = None) -> bool:
        """Before a daemon starts a new run: wait out a lame duck; False once the daemon stopped accepting."""
        self.held += 1
        try:
            while self.lame_duck and accepting() and not (drain is not None and drain.requested):
                await self._changed_or(drain)
        finally:
            self.held -= 1
        return accepting() and not (drain is not None and drain.requested)

    async def _changed_or(self, drain: DrainLatch | None) -> None:
        if drain is None:
            await self.changed()
            return
        async with trio.open_nursery() as nursery:
            async def first(wait: Callable[[], Any]) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(first, self.changed)
            nursery.start_soon(first, drain.wait)


_CURRENT: ContextVar[Operator | None] = ContextVar("agentd_operator", default=None)


def current_operator() -> Operator | None:
    """The daemon's operator switches, or None (a subagent, a library caller without controls)."""
    return _CURRENT.get()


@contextlib.contextmanager
def use_operator(operator: Operator) -> Iterator[Operator]:
    token = _CURRENT.set(operator)
    try:
        yield operator
    finally:
        _CURRENT.reset(token)


__all__ = ["Operator", "RunEntry", "Staged", "Stager", "current_operator", "use_operator"]
