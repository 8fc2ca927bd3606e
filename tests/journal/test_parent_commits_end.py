"""A subagent's run whose parent run commits its end (agentd.journal.recorder.RunRecorder.parent_commits_end): its
final answer is held for the next commit, its ``run.ended`` is not flushed; on the real SQLite file, with a
trigger noting the ``synchronous`` each row was written under and the transaction's clock reading."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agentd.journal.recorder import RunRecorder
from agentd.journal.records import RunStarted
from agentd.journal.sqlite import DB_NAME, open_journal
from tests.journal.noting import FULL, NORMAL, noting_journal

CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "pay__charge", "arguments": "{}"}}]}


def _rows(state: Path) -> list[tuple[str, int, float]]:
    with sqlite3.connect(state / DB_NAME) as conn:
        seen = conn.execute("SELECT kind, sync FROM seen ORDER BY rowid").fetchall()
        times = [t for (t,) in conn.execute("SELECT ts FROM entries WHERE run_id = 'child' ORDER BY seq")]
    return [(kind, sync, ts) for (kind, sync), ts in zip(seen, times, strict=True)]


async def test_the_final_answer_goes_with_the_unflushed_end(tmp_path: Path) -> None:
    await noting_journal(tmp_path)
    async with open_journal(str(tmp_path), checked=True) as journal:
        recorder = RunRecorder(journal, "child", parent_commits_end=True)
        await recorder.started(RunStarted("d", "charge it", parent="root"), deferred=True)
        await recorder.replied(1, CALL, 10, 5)
        await recorder.observed(1, "c1", True, "charged")
        await recorder.replied(2, {"role": "assistant", "content": "done"}, 10, 5)
        assert [kind for kind, _, _ in _rows(tmp_path)][-1] == "tool.outcome"  # the answer is held
        await recorder.ended("completed", {"result": "done"}, None)
    rows = _rows(tmp_path)
    assert [(kind, sync) for kind, sync, _ in rows] == [
        ("run.started", FULL), ("model.reply", FULL), ("tool.requested", FULL), ("usage", FULL),
        ("tool.outcome", NORMAL), ("model.reply", NORMAL), ("usage", NORMAL), ("run.ended", NORMAL)]
    assert len({ts for _, _, ts in rows[-3:]}) == 1 and rows[-4][2] < rows[-1][2]  # one transaction


async def test_a_held_answer_the_run_goes_on_from_is_committed_with_the_next_step(tmp_path: Path) -> None:
    """An answer the run does not end with (its output contract refused it): it goes with the next commit, in
    order, and a run stopped before its end (drained, cancelled) commits it alone."""
    await noting_journal(tmp_path)
    async with open_journal(str(tmp_path), checked=True) as journal:
        recorder = RunRecorder(journal, "child", parent_commits_end=True)
        await recorder.started(RunStarted("d", "answer in JSON", parent="root"), deferred=True)
        await recorder.replied(1, {"role": "assistant", "content": "not JSON"}, 10, 5)
        assert _rows(tmp_path) == []
        await recorder.replied(2, CALL, 10, 5)
        await recorder.replied(3, {"role": "assistant", "content": "{}"}, 10, 5)
        await recorder.commit_started()
        await recorder.commit_started()  # nothing held: nothing written
    assert [(kind, sync) for kind, sync, _ in _rows(tmp_path)] == [
        ("run.started", FULL), ("model.reply", FULL), ("usage", FULL), ("model.reply", FULL),
        ("tool.requested", FULL), ("usage", FULL), ("model.reply", NORMAL), ("usage", NORMAL)]
