"""The loop names each tool call it sends (its idempotency key, agentd.formats.ids.call_key): by the run id, the run's
nonce, the step and the call's place in the model's order. A recovered run re-sends a lost call under the key it
was first sent with; the journal keeps the nonce (an older journal without one still resumes).

End to end (the key on the wire, a reconnect, a SIGKILL): tests/durable/test_idempotency_key.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentd.agent.runner import Resume, RunRequest
from agentd.formats.ids import call_key
from agentd.journal.records import ModelReply, RunStarted, ToolCallRequested, decode, encode
from agentd.journal.sqlite import open_journal
from agentd.run import journal_run, run_with
from agentd.telemetry.events import EventLog
from tests.agent.scripted import MemoryPool, ScriptedModel, call, final, text_result, tools_reply


async def _look(args: Any) -> Any:
    return text_result(f"found {args.get('k')}")


def _pool() -> MemoryPool:
    pool = MemoryPool()
    pool.add("s", "look", _look, annotations={"idempotentHint": True})
    return pool


async def _run(pool: MemoryPool, replies: list[Any], request: RunRequest) -> Any:
    return await run_with(request, pool=pool, intel=ScriptedModel(replies), log=EventLog(sink=lambda line: None))


async def test_each_call_is_named_by_its_step_and_place() -> None:
    pool = _pool()
    request = RunRequest("look", "run-1")
    step_one = tools_reply(*(call("s__look", {"k": 1}, f"c{i}") for i in range(3)))
    await _run(pool, [step_one, tools_reply(call("s__look", {"k": 1}, "c0")), final("done")], request)
    nonce = request.key_nonce
    assert nonce and pool.keys == [call_key("run-1", nonce, 1, 0), call_key("run-1", nonce, 1, 1),
                                   call_key("run-1", nonce, 1, 2), call_key("run-1", nonce, 2, 0)]
    assert len(set(pool.keys)) == 4


async def test_runs_sharing_a_run_id_name_the_same_call_apart() -> None:
    # A warm child session's turns and a manifest's steps run the loop again under one run id.
    pool = _pool()
    for _ in range(2):
        await _run(pool, [tools_reply(call("s__look", {"k": 1})), final("done")], RunRequest("look", "child/1"))
    first, second = pool.keys
    assert first != second and first.startswith("child/1/") and second.startswith("child/1/")


def _resume(*, pending: tuple[str, ...]) -> Resume:
    listed = [{"id": f"c{i}", "type": "function", "function": {"name": "s__look", "arguments": '{"k": 1}'}}
              for i in range(3)]
    messages = ({"role": "assistant", "content": None, "tool_calls": listed},
                {"role": "tool", "tool_call_id": "c0", "content": "found 1"})
    return Resume(messages=messages, steps=3, pending=tuple(call("s__look", {"k": 1}, cid) for cid in pending))


async def test_a_recovered_run_resends_a_lost_call_under_its_first_key() -> None:
    pool = _pool()
    request = RunRequest("look", "run-1", resume=_resume(pending=("c1", "c2")), key_nonce="n0")
    await _run(pool, [tools_reply(call("s__look", {"k": 2}, "c0")), final("done")], request)
    assert pool.keys == [call_key("run-1", "n0", 3, 1), call_key("run-1", "n0", 3, 2), call_key("run-1", "n0", 4, 0)]


async def test_the_journal_keeps_the_nonce_and_an_older_journal_resumes_without_one(tmp_path: Path) -> None:
    log = EventLog(sink=lambda line: None)
    async with open_journal(str(tmp_path)) as journal:
        first = RunRequest("look", "r-new")
        await journal_run(journal, first, settings={}, log=log)
        again = await journal_run(journal, RunRequest("look", "r-new"), settings={}, log=log)
        assert again.request.key_nonce == first.key_nonce != ""

        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "s__look", "arguments": "{}"}}]}
        old = {k: v for k, v in encode(RunStarted("d", "look")).items() if k != "key_nonce"}
        await journal.append("r-old", [decode(old), ModelReply(1, message), ToolCallRequested(1, "c0", "s__look", "{}")])
        resumed = await journal_run(journal, RunRequest("look", "r-old"), settings={}, log=log)
    assert resumed.request.key_nonce == "" and resumed.request.resume is not None
    pool = _pool()
    await _run(pool, [final("done")], resumed.request)
    assert pool.keys == [call_key("r-old", "", 1, 0)] == ["r-old/1.0"]
