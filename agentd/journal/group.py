"""Group commit: appends that arrive while a commit is in progress are committed together, in the next one.

Why: a step's records are durable before agentd acts on them (a synchronous commit on PostgreSQL, an fsync
of SQLite's WAL), and a durable commit costs one flush however many batches it holds. Each store already
serialises its transactions on one worker thread; :class:`GroupCommit` sits in front of that thread, so
while one transaction is on it, the batches of every other run queue up and the next transaction takes
them all: N concurrent runs cost one flush per round, not N.

Who commits: no task of its own (a store has no nursery). The first caller that finds the writer idle
commits whatever is queued (its own batch among it) and wakes the others; a waiter that finds its batch
committed returns its outcome, else, the writer being idle again, commits the next group itself. Each
batch has its own outcome (the store decides which failures are per batch, such as a lost lease, and
which fail the whole transaction).

Cancellation: a waiter cancelled before its batch was taken withdraws it (nothing written, as a call that
never reached the worker thread). Once a group is taken its commit runs shielded to the end (bounded by
the store's own timeouts: a call on the worker thread cannot be abandoned anyway), so the batches of
other runs in it are never lost with the task that carried them; a cancelled caller whose batch was
committed sees the cancellation, as it would have after an ungrouped commit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import attrs
import trio

B = TypeVar("B")
R = TypeVar("R")


@attrs.define(eq=False)
class Pending(Generic[B, R]):
    """One caller's batch in the queue, and its outcome once the group holding it was committed."""

    batch: B
    taken: bool = False
    done: bool = False
    result: R | None = None
    error: BaseException | None = None

    def settle(self, result: R | None = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.done = result, error, True

    def outcome(self) -> R:
        if self.error is not None:
            raise self.error
        assert self.done
        return self.result  # type: ignore[return-value]


#: Commits one group, in order, settling every Pending of it (a failure of the whole transaction settles each
#: with that error); called with the writer held, never concurrently with itself.
Flush = Callable[[Sequence[Pending[B, R]]], Awaitable[None]]


@attrs.define(eq=False)
class GroupCommit(Generic[B, R]):
    """The queue in front of one store's writer (see the module docstring)."""

    flush: Flush[B, R]
    _queue: list[Pending[B, R]] = attrs.field(factory=list)
    _busy: bool = False
    _idle: trio.Event = attrs.field(factory=trio.Event)
    #: Groups committed and batches in them (the bench's and the tests' view of how much was grouped).
    groups: int = 0
    batches: int = 0

    async def submit(self, batch: B) -> R:
        """Commit ``batch`` (with whatever else is queued); its outcome, or its error raised."""
        pending: Pending[B, R] = Pending(batch)
        self._queue.append(pending)
        while not pending.done:
            if not self._busy:
                await self._lead()
                continue
            try:
                await self._idle.wait()
            except BaseException:
                if not pending.taken:  # withdrawn: never reached the writer
                    self._queue.remove(pending)
                raise
        return pending.outcome()

    async def _lead(self) -> None:
        group, self._queue = self._queue, []
        for pending in group:
            pending.taken = True
        self._busy = True
        try:
            with trio.CancelScope(shield=True):
                try:
                    await self.flush(group)
                except BaseException as exc:  # the flush failed as a whole: every batch in it did
                    for pending in group:
                        if not pending.done:
                            pending.settle(error=exc)
                    if not isinstance(exc, Exception):
                        raise
                for pending in group:
                    if not pending.done:  # a flush that forgot one: never leave a waiter hanging
                        pending.settle(error=RuntimeError("group commit: batch not settled"))
            self.groups += 1
            self.batches += len(group)
        finally:
            self._busy = False
            self._idle.set()
            self._idle = trio.Event()


__all__ = ["Flush", "GroupCommit", "Pending"]
