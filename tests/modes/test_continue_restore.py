"""A ``--continue`` session rebuilt from a real SQLite journal (agentd.modes.continue_route.restore_session):
the newest turn's ``seed_runs`` give the history, an ended newest turn joins it, an unfinished one is the
interrupted turn with exactly that seed, other wakes in between are skipped, and the history keeps the last
MAX_SEED_TURNS turns. The end-to-end crash test is tests/durable/test_continue_resume.py."""

from __future__ import annotations

from typing import Any

from agentd.journal.recorder import RunRecorder
from agentd.journal.records import RunStarted
from agentd.journal.sqlite import open_journal
from agentd.journal.store import JournalStore
from agentd.modes.continue_route import MAX_SEED_TURNS, Turn, restore_session, turns_of


async def _turn(journal: JournalStore, run_id: str, message: str, *, seed_runs: tuple[str, ...] | None,
                answer: Any = None, ended: bool = True) -> None:
    recorder = RunRecorder(journal, run_id)
    await recorder.started(RunStarted("sha256:x", message, seed_runs=seed_runs))
    await recorder.replied(1, {"role": "assistant", "content": f"said {message}"}, 1, 1)
    if ended:
        await recorder.ended("completed", {"result": answer}, None)


async def test_the_newest_turn_gives_the_history_and_an_unfinished_one_is_resumed_from_its_seed(tmp_path) -> None:
    async with open_journal(str(tmp_path)) as journal:
        await _turn(journal, "d.1", "I\n\n---\nm1", seed_runs=(), answer="a1")
        await _turn(journal, "d.2", "a fresh wake", seed_runs=None, answer="w")  # not a turn of the session
        await _turn(journal, "d.3", "m3", seed_runs=("d.1",), answer={"n": 3})
        await _turn(journal, "d.4", "m4", seed_runs=("d.1", "d.3"), ended=False)
        newest_first = ["d.4", "d.3", "d.2", "d.1"]

        restored = await restore_session(journal, newest_first)
        assert restored.turns == (Turn("d.1", "I\n\n---\nm1", "a1"), Turn("d.3", "m3", "{'n': 3}"))
        job = restored.interrupted
        assert job is not None and (job.trigger, job.resume, job.instruction) == ("resume", "d.4", "m4")
        assert job.seed_runs == ("d.1", "d.3")
        assert [m["content"] for m in job.seed] == ["I\n\n---\nm1", "a1", "m3", "{'n': 3}"]

        await RunRecorder(journal, "d.4").ended("completed", {"result": "a4"}, None)
        after = await restore_session(journal, newest_first)
        assert [t.run_id for t in after.turns] == ["d.1", "d.3", "d.4"] and after.interrupted is None


async def test_the_history_keeps_the_last_turns_and_a_turn_without_an_end_answers_with_its_last_reply(tmp_path
                                                                                                     ) -> None:
    async with open_journal(str(tmp_path)) as journal:
        ids: list[str] = []
        for n in range(1, MAX_SEED_TURNS + 4):
            await _turn(journal, f"d.{n}", f"m{n}", seed_runs=tuple(ids[-MAX_SEED_TURNS:]), answer=f"a{n}",
                        ended=n != 2)
            ids.append(f"d.{n}")
        restored = await restore_session(journal, ids[::-1])
        assert [t.run_id for t in restored.turns] == ids[-MAX_SEED_TURNS:]
        assert restored.interrupted is None
        [drained] = await turns_of(journal, ["d.2", "d.gone"])  # a run retention removed is left out
        assert drained == Turn("d.2", "m2", "said m2")
        assert (await restore_session(journal, [])).turns == ()


async def test_retention_keeps_the_turns_a_continue_session_is_seeded_from(tmp_path) -> None:
    """A session's turns are named in the journal's kept-runs state as it goes, so the daemon's retention (here
    one run) never removes a turn the next one is seeded from: a restart still restores the whole history."""
    from agentd.agent.budgets import Limits
    from agentd.agent.result import RunResult, RunStatus
    from agentd.modes.continue_route import ConversationSession
    from agentd.modes.runs import DaemonRuns
    from agentd.run import open_state
    from agentd.telemetry.events import null_log

    async with open_journal(str(tmp_path)) as journal:
        async def run_job(job: Any, run_id: str, controls: Any, limits: Any) -> RunResult:
            await _turn(journal, run_id, job.instruction, seed_runs=job.seed_runs, answer=f"answer {run_id}")
            return RunResult(run_id=run_id, status=RunStatus.COMPLETED, result=f"answer {run_id}")

        session = ConversationSession(DaemonRuns(run_job, "d", Limits(), state=journal), "I")
        for message in ("m1", "m2", "m3"):
            await session.send(message, uri="r://x")
        await _turn(journal, "d.4", "a fresh wake", seed_runs=None, answer="w")  # newer than every turn
    async with open_state(str(tmp_path), log=null_log(), keep_for=0, keep_runs=1) as state:
        assert state is not None
        assert {s.run_id for s in await state.list_runs()} == {"d.1", "d.2", "d.3", "d.4"}
        restored = await restore_session(state, ["d.4", "d.3", "d.2", "d.1"])
        assert [t.run_id for t in restored.turns] == ["d.1", "d.2", "d.3"]
        assert restored.turns[0].answer == "answer d.1"
