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

Cancellation: a caller cancelled before its batch was taken withdraws it (nothing written, as a call that
never reached the worker thread). A store's flush is cancellable only before its transaction reached the
worker thread (SQLite's worker and ``trio.to_thread.run_sync`` wait for their turn cancellably, then run the
call to its end and return), so a leader cancelled while the group waits for the thread puts the other callers' batches
back in line, first, and withdraws its own; a group that reached the thread is committed and settled
whatever happens to the task that carried it, and a cancelled caller whose batch was committed gets its
outcome (as after an ungrouped commit that had started).
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
#: with that error); called with the writer held, never concurrently with itself. It may raise trio.Cancelled
#: only before anything of the group reached the store (then it settles nothing).
Flush = Callable[[Sequence[Pending[B, R]]], Awaitable[None]]


@attrs.define(eq=False)
class GroupCommit(Generic[B, R]):
    """The queue in front of one store's writer (see the module docstring)."""

    flush: Flush[B, R]
    _queue: list[Pending[B, R]] = attrs.field(factory=list)
    _busy: bool = False
    _idle: trio.Event = attrs.field(factory=trio.Event)
    _waiting: int = 0
    #: Groups committed and batches in them (the bench's and the tests' view of how much was grouped).
    groups: int = 0
    batches: int = 0

    async def submit(self, batch: B) -> R:
        """Commit ``batch`` (with whatever else is queued); its outcome, or its error raised."""
        pending: Pending[B, R] = Pending(batch)
        self._queue.append(pending)
        try:
            while not pending.done:
                if not self._busy:
                    await self._lead()
                    continue
                self._waiting += 1
                try:
                    await self._idle.wait()
                finally:
                    self._waiting -= 1
        except BaseException:
            if not pending.taken:  # withdrawn: never reached the store
                self._queue.remove(pending)
            raise
        return pending.outcome()

    async def _lead(self) -> None:
        group, self._queue = self._queue, []
        for pending in group:
            pending.taken = True
        self._busy = True
        try:
            await self.flush(group)
        except trio.Cancelled:
            for pending in group:  # nothing reached the store: back in line, ahead of what came since
                pending.taken = False
            self._queue[:0] = group
            raise
        except BaseException as exc:  # the flush failed as a whole: every batch in it did
            for pending in group:
                if not pending.done:
                    pending.settle(error=exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._busy = False
            if self._waiting:
                self._idle.set()
                self._idle = trio.Event()
        for pending in group:
            if not pending.done:  # a flush that forgot one: never leave a caller waiting
                pending.settle(error=RuntimeError("group commit: batch not settled"))
        self.groups += 1
        self.batches += len(group)


__all__ = ["Flush", "GroupCommit", "Pending"]
