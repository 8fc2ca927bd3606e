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
        self.groups: list[list[str]] = []
        self.gate = trio.Event()
        self.fail: Exception | None = None

    async def __call__(self, group: Sequence[Pending[str, int]]) -> None:
        self.groups.append([p.batch for p in group])
        await self.gate.wait()
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
        assert flush.groups == [["a"]]  # the others wait for the commit in progress
        flush.gate.set()
    assert flush.groups == [["a"], ["b", "bad", "c"]]
    assert results == {"a": 100, "b": 200, "bad": "bad refused", "c": 202}
    assert (writer.groups, writer.batches) == (2, 4)


async def test_a_caller_cancelled_while_queued_withdraws_its_batch_and_a_cancelled_leader_still_commits_its_group():
    flush = HeldFlush()
    writer: GroupCommit[str, int] = GroupCommit(flush)
    queued, leader = trio.CancelScope(), trio.CancelScope()
    results: dict[str, object] = {}

    async def submit(batch: str, scope: trio.CancelScope | None = None) -> None:
        with scope or trio.CancelScope():
            results[batch] = await writer.submit(batch)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, "lead", leader)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, "withdrawn", queued)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, "kept")
        await trio.testing.wait_all_tasks_blocked()
        queued.cancel()  # never reached the writer: nothing of it is committed
        leader.cancel()  # its commit is under way: it finishes, and the next group is committed by a waiter
        await trio.testing.wait_all_tasks_blocked()
        flush.gate.set()
    assert flush.groups == [["lead"], ["kept"]]
    assert results == {"lead": 100, "kept": 200}  # the cancelled leader's commit went through


async def test_a_flush_that_fails_as_a_whole_fails_every_batch_in_it():
    flush = HeldFlush()
    flush.fail = JournalError("disk full")
    flush.gate.set()
    writer: GroupCommit[str, int] = GroupCommit(flush)
    with pytest.raises(JournalError, match="disk full"):
        await writer.submit("x")
    flush.fail = None
    assert await writer.submit("y") == 200  # the writer is free again
