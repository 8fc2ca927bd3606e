"""Group commit (agentd.journal.group) with a flush the test holds: who commits what, in which group, and what a
cancelled caller leaves behind."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from agentd.journal.errors import JournalError
from agentd.journal.group import GroupCommit, Pending


class HeldFlush:
    """Commits each group when the test lets it: the groups it saw, in order."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []  # each group the flush was handed
        self.groups: list[list[str]] = []  # each group it committed
        self.permits = trio.Semaphore(0)  # one commit per permit the test gives
        self.fail: Exception | None = None
        self.leaders: list[trio.lowlevel.Task] = []

    async def __call__(self, group: Sequence[Pending[str, int]]) -> None:
        self.seen.append([p.batch for p in group])
        self.leaders.append(trio.lowlevel.current_task())  # the caller that leads this group
        await self.permits.acquire()  # as a store waits for its worker thread: cancellable, nothing written yet
        self.groups.append([p.batch for p in group])
        if self.fail is not None:
            raise self.fail
        for n, pending in enumerate(group):
            pending.settle(error=JournalError(f"{pending.batch} refused") if pending.batch == "bad" else None,
                           result=None if pending.batch == "bad" else len(self.groups) * 100 + n)


async def test_batches_queued_during_a_commit_share_the_next_one_each_with_its_own_outcome():
    flush = HeldFlush()
    writer: GroupCommit[str, int] = GroupCommit(flush)
    results: dict[str, object] = {}

    async def submit(batch: str) -> None:
        try:
            results[batch] = await writer.submit(batch)
        except JournalError as exc:
            results[batch] = str(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, "a")
        await trio.testing.wait_all_tasks_blocked()
        for batch in ("b", "bad", "c"):
            nursery.start_soon(submit, batch)
            await trio.testing.wait_all_tasks_blocked()  # queued in this order
        assert flush.seen == [["a"]]  # the others wait for the commit in progress
        flush.permits.release()
        flush.permits.release()
    assert flush.groups == [["a"], ["b", "bad", "c"]]
    assert results == {"a": 100, "b": 200, "bad": "bad refused", "c": 202}
    assert (writer.groups, writer.batches) == (2, 4)


async def test_cancelled_callers_withdraw_their_batches_and_the_others_are_committed_in_order():
    """A caller cancelled while queued, and a leader cancelled while its group waits for the store, leave nothing
    of theirs; the batches of the others the leader had taken go back in line, ahead of later ones.

    Which of two waiters woken together leads the next group is trio's scheduling choice (it varies the order
    on purpose), so the test cancels the task that actually leads."""
    flush = HeldFlush()
    writer: GroupCommit[str, int] = GroupCommit(flush)
    scopes = {batch: trio.CancelScope() for batch in ("first", "withdrawn", "x", "y", "later")}
    tasks: dict[trio.lowlevel.Task, str] = {}
    results: dict[str, object] = {}

    async def submit(batch: str) -> None:
        tasks[trio.lowlevel.current_task()] = batch
        with scopes[batch]:
            results[batch] = await writer.submit(batch)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(submit, "first")
            await trio.testing.wait_all_tasks_blocked()
            for batch in ("withdrawn", "x", "y"):
                nursery.start_soon(submit, batch)
                await trio.testing.wait_all_tasks_blocked()
            scopes["withdrawn"].cancel()
            await trio.testing.wait_all_tasks_blocked()
            flush.permits.release()  # "first" commits; then x or y leads the next group, the other in it
            await trio.testing.wait_all_tasks_blocked()
            assert flush.seen == [["first"], ["x", "y"]]
            lead = tasks[flush.leaders[1]]
            kept = "y" if lead == "x" else "x"
            nursery.start_soon(submit, "later")
            await trio.testing.wait_all_tasks_blocked()
            scopes[lead].cancel()  # while its group waits for the store
            await trio.testing.wait_all_tasks_blocked()
            flush.permits.release()
    assert flush.groups == [["first"], [kept, "later"]]
    assert results == {"first": 100, kept: 200, "later": 201}


async def test_a_flush_that_fails_as_a_whole_fails_every_batch_in_it():
    flush = HeldFlush()
    flush.fail = JournalError("disk full")
    flush.permits.release()
    flush.permits.release()
    writer: GroupCommit[str, int] = GroupCommit(flush)
    with pytest.raises(JournalError, match="disk full"):
        await writer.submit("x")
    flush.fail = None
    assert await writer.submit("y") == 200  # the writer is free again
