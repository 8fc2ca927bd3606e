"""An async subagent of the model's own run survives a SIGKILL of the root: the resumed run spawns it again under
the handle the model holds, the child resumes its journaled run (``PARENT/STEP.CALL``), and the model's
``subagent.await`` of that handle answers with the finished result. The child's tool call in flight at the crash is
never made twice (counted at a real MCP server): a non-idempotent one is reported to its model as unknown, an
idempotent one is sent again under the idempotency key it was first sent with.

Each scenario runs several times (``AGENTD_CRASH_REPEAT``, default 3) with fresh run ids, to catch a race between
the kill and the commits.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.ctl.daemon import daemon, kill
from tests.durable.peer import counting_peer
from tests.durable.test_tree_crash import UNKNOWN, _child_pid, _runs, _said
from tests.integration.agents import text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]

REPEAT = int(os.environ.get("AGENTD_CRASH_REPEAT", "3"))
KEY = "io.modelcontextprotocol/idempotency-key"


def _awaited(content: str) -> dict[str, Any] | None:
    """The structured answer of a ``subagent.await`` that reports the child done, else None."""
    try:
        seen = json.loads(content.split("\n", 1)[0])
    except ValueError:
        return None
    return seen if isinstance(seen, dict) and seen.get("done") is True else None


def _reply(tool: str, hold: str, gate: trio.Event) -> Any:
    """The parent spawns one async child and awaits its handle until it is done; the child calls ``tool`` once
    (``hold``: the first call hangs before or after it takes effect; ``reply``: it answers, and the child's next
    model reply waits for ``gate``) and reports what it saw."""

    def reply(request: RecordedRequest) -> dict[str, Any]:
        last = request.messages[-1] if request.messages else {}
        if "CHILD" in _said(request):
            if last.get("role") == "tool":
                return text(f"child saw: {text_of(last.get('content'))}",
                            **({"wait": gate} if hold == "reply" else {}))
            return tool_call(f"pay__{tool}", {"key": "order-1", **({"hold": hold} if hold != "reply" else {})})
        if not any(m.get("role") == "tool" for m in request.messages):
            return tool_call("subagent_spawn", {"instruction": "CHILD: charge order 1", "async": True})
        content = text_of(last.get("content"))
        if _awaited(content) is not None:
            return text(f"parent got: {content}")
        return tool_call("subagent_await", {"handle": "0.1"})  # the spawn's handle, "still running", unknown

    return reply


@pytest.mark.parametrize(("tool", "hold", "target"), [
    ("charge", "before", "root"), ("charge", "after", "root"), ("charge", "after", "tree"), ("charge", "reply", "tree"),
    ("lookup", "after", "root"),
])
async def test_an_async_child_resumes_under_its_handle_after_the_root_is_killed(tmp_path: Path, tool: str,
                                                                                hold: str, target: str) -> None:
    for attempt in range(REPEAT):
        tmp = tmp_path / str(attempt)
        tmp.mkdir()
        state, run, gate = tmp / "state", f"async-{attempt}", trio.Event()
        async with counting_peer() as peer, scripted_gateway(default=_reply(tool, hold, gate)) as gw:
            argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--instruction", "PARENT: delegate",
                    "--run-id", run, "--state-dir", str(state), "--deadline", "120s", "--cancel-grace", "1"]
            async with daemon(argv, tmp, "first") as d:
                if hold == "reply":  # the call answered and its outcome is committed; the child's next reply is held
                    await d.until(lambda: peer.count(tool) == 1 and any(
                        r["kind"] == "tool.outcome" for name, records in _runs(state).items()
                        if name.startswith(f"{run}/") for r in records))
                else:
                    await d.until(lambda: len(peer.received) == 1)
                child = _child_pid(d)
                assert child is not None, d.stderr.read_text()[-3000:]
                kill(d)
                if target == "tree":
                    with contextlib.suppress(ProcessLookupError):  # it may already be gone with its parent
                        os.kill(child, signal.SIGKILL)
                await d.wait()
            gate.set()
            async with daemon(argv, tmp, "second") as again:
                code, result = await again.wait(timeout=90)
            stderr = again.stderr.read_text()
            assert code == 0, stderr[-3000:]
            answer = str(result["result"])
            assert answer.startswith("parent got:"), answer
            seen = _awaited(answer.removeprefix("parent got: "))
            assert seen is not None and seen["handle"] == "0.1" and seen["status"] == "completed", answer
            said = str(seen["result"])
            assert said.startswith("child saw:"), seen
            executions = peer.count(tool)
            if tool == "lookup":  # idempotent: sent again, under the key it was first sent with
                assert [c["name"] for c in peer.received] == ["lookup", "lookup"], peer.received
                keys = {c["meta"][KEY] for c in peer.received}
                assert len(keys) == 1 and "" not in keys, peer.received
                assert "execution #2" in said, said
            else:  # not idempotent: never sent twice
                assert [c["name"] for c in peer.received] == ["charge"], peer.received
                assert executions == (0 if hold == "before" else 1)
                if hold == "reply":  # its outcome was committed: replayed to the resumed child, not asked again
                    assert "execution #1" in said and UNKNOWN not in said, said
                else:
                    assert UNKNOWN in said, said
            resumed = again.events("subagent.resumed")
            assert [(e["handle"], e["status"]) for e in resumed] == [("0.1", "running")], resumed
            del gw
        runs = _runs(state)
        children = [name for name in runs if name.startswith(f"{run}/")]
        assert len(children) == 1, list(runs)
        records = runs[children[0]]
        assert records[0]["kind"] == "run.started" and records[0]["parent"] == "0", records[0]
        assert records[-1]["kind"] == "run.ended" and records[-1]["status"] == "completed", records[-1]
        assert [r["name"] for r in records if r["kind"] == "tool.requested"] == [f"pay__{tool}"]
        parent = runs[run]
        assert [s["handle"] for s in parent if s["kind"] == "spawn"] == ["0.1"], parent
        ends = [(r["handle"], r["status"]) for r in parent if r["kind"] == "child.result"]
        assert ends == [("0.1", "completed")], ends


async def test_an_async_spawn_in_flight_at_the_crash_answers_the_handle_of_the_child_it_had_started(tmp_path: Path
                                                                                                    ) -> None:
    """The crash fell between an async spawn's child starting (its ``spawn`` record committed) and the call's
    outcome: the journal is written as that crash left it. The resumed run resumes the child under its handle,
    and the spawn call made again answers that same handle (one child, one ``spawn`` record), not a second
    child; the child's own call in flight is not sent again."""
    from agentd.journal.records import ModelReply, RunStarted, Spawned, ToolCallRequested, Usage
    from agentd.journal.sqlite import open_journal

    state, run = tmp_path / "state", "spawned-1"
    spawn_args = json.dumps({"instruction": "CHILD: charge order 1", "async": True})
    charge_args = json.dumps({"key": "order-1"})

    def asks(call: str, name: str, arguments: str) -> dict[str, Any]:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": name, "arguments": arguments}}]}

    async with open_journal(str(state)) as journal:
        await journal.append(run, [RunStarted("sha256:x", "PARENT: delegate", key_nonce="n1")], durable=True)
        await journal.append(run, [ModelReply(1, asks("call_1", "subagent_spawn", spawn_args)),
                                   ToolCallRequested(1, "call_1", "subagent_spawn", spawn_args), Usage(1, 10, 5)],
                             durable=True)
        await journal.append(run, [Spawned(1, "0.1", "CHILD: charge order 1", None, f"{run}/1.call_1")], durable=True)
        child = f"{run}/1.call_1"
        await journal.append(child, [RunStarted("sha256:x", "CHILD: charge order 1", parent="0", key_nonce="n2")],
                             durable=True)
        await journal.append(child, [ModelReply(1, asks("call_1", "pay__charge", charge_args)),
                                     ToolCallRequested(1, "call_1", "pay__charge", charge_args), Usage(1, 10, 5)],
                             durable=True)

    async with counting_peer() as peer, scripted_gateway(default=_reply("charge", "before", trio.Event())) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--instruction", "PARENT: delegate",
                "--run-id", run, "--state-dir", str(state), "--deadline", "120s", "--cancel-grace", "1"]
        async with daemon(argv, tmp_path, "resumed") as d:
            code, result = await d.wait(timeout=90)
        assert code == 0, d.stderr.read_text()[-3000:]
        assert peer.received == []  # the child's call in flight was not sent again
        del gw
    answer = str(result["result"])
    seen = _awaited(answer.removeprefix("parent got: "))
    assert seen is not None and seen["handle"] == "0.1" and seen["status"] == "completed", answer
    assert UNKNOWN in str(seen["result"]), seen
    records = _runs(state)[run]
    assert [r["handle"] for r in records if r["kind"] == "spawn"] == ["0.1"], records
    spawned = json.loads(next(r["result"] for r in records if r["kind"] == "tool.outcome" and r["call_id"] == "call_1"))
    assert spawned["handle"] == "0.1", spawned
    assert [name for name in _runs(state) if name.startswith(f"{run}/")] == [child]


async def test_a_grandchilds_async_run_resumes_under_its_handle_through_the_resumed_child(tmp_path: Path) -> None:
    """One level down: the root's synchronous child spawned an async grandchild, whose charge was in flight when
    the tree was SIGKILLed. The resumed root makes its spawn again, the child resumes its run and, through the
    root's chokepoint (the ``admit`` frame names the handle), the grandchild under ``0.1.1``; the child's await
    of it answers its result, and the charge is not sent again."""
    state, run = tmp_path / "state", "nested-1"

    def reply(request: RecordedRequest) -> dict[str, Any]:
        said, last = _said(request), (request.messages[-1] if request.messages else {})
        content = text_of(last.get("content")) if last.get("role") == "tool" else ""
        if "GRANDCHILD" in said:
            if content:
                return text(f"grandchild saw: {content}")
            return tool_call("pay__charge", {"key": "order-1", "hold": "after"})
        if "CHILD" in said:
            if not content:
                return tool_call("subagent_spawn", {"instruction": "GRANDCHILD: charge order 1", "async": True})
            if _awaited(content) is not None:
                return text(f"child got: {content}")
            return tool_call("subagent_await", {"handle": "0.1.1"})
        if content:
            return text(f"parent got: {content}")
        return tool_call("subagent_spawn", {"instruction": "CHILD: delegate the charge"})

    async with counting_peer() as peer, scripted_gateway(default=reply) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--instruction", "PARENT: delegate",
                "--run-id", run, "--state-dir", str(state), "--deadline", "120s", "--cancel-grace", "1"]
        async with daemon(argv, tmp_path, "first") as d:
            await d.until(lambda: peer.count("charge") == 1)
            kill(d)
            await d.wait()
        async with daemon(argv, tmp_path, "second") as again:
            code, result = await again.wait(timeout=90)
        stderr = again.stderr.read_text()
        assert code == 0, stderr[-3000:]
        assert [c["name"] for c in peer.received] == ["charge"], peer.received
        del gw
    child = json.loads(str(result["result"]).removeprefix("parent got: "))
    assert child["handle"] == "0.1" and child["status"] == "completed", child
    seen = _awaited(str(child["result"]).removeprefix("child got: "))
    assert seen is not None and seen["handle"] == "0.1.1" and seen["status"] == "completed", child
    assert str(seen["result"]).startswith("grandchild saw:") and UNKNOWN in str(seen["result"]), seen
    assert "subagent.resumed" in stderr  # the child's line, relayed
    grandchild = _runs(state)[f"{run}/1.call_1/1.call_1"]
    assert grandchild[-1]["kind"] == "run.ended" and grandchild[-1]["status"] == "completed", grandchild[-1]
