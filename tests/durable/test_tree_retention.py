"""Journal retention keeps the runs of an unfinished run's subagents (``PARENT/...``, at any depth): a resumed
parent's spawn made again must find its child's run to resume or replay it, never run the child afresh."""

from __future__ import annotations

from agentd.journal.recorder import RunRecorder
from agentd.journal.records import RunStarted
from agentd.journal.sqlite import open_journal
from agentd.run import open_state
from agentd.telemetry.events import null_log


async def _run(journal: object, run_id: str, *, end: bool) -> None:
    recorder = RunRecorder(journal, run_id)  # type: ignore[arg-type]
    await recorder.started(RunStarted("sha256:x", f"do {run_id}"))
    if end:
        await recorder.ended("completed", {"result": "ok"}, None)


async def test_an_unfinished_runs_children_outlive_retention(tmp_path):
    async with open_journal(str(tmp_path)) as journal:
        await _run(journal, "P", end=False)  # the parent, left unfinished by a crash
        await _run(journal, "P/1.call_1", end=True)  # its child had ended
        await _run(journal, "P/1.call_1/2.call_1", end=True)  # and its grandchild
        await _run(journal, "PX/1.call_1", end=True)  # not under P
        await _run(journal, "Q", end=True)  # finished later: the one run keep_runs=1 keeps
    async with open_state(str(tmp_path), log=null_log(), keep_for=0, keep_runs=1) as state:
        assert state is not None
        kept = {s.run_id for s in await state.list_runs()}
    assert kept == {"P", "P/1.call_1", "P/1.call_1/2.call_1", "Q"}, kept
