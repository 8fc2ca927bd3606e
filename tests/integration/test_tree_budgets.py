"""Budgets hold at the root, and usage is the whole tree's: real ``agentd`` processes (and their real children)
against the scripted gateway, which reports the usage each reply costs.

- ``--token-ceiling`` stops the root run like every child: the reply that crosses it ends the run (exit 7), no
  further model request is made, and its tokens are in the result;
- the stdout result's ``usage`` is the whole tree's (the root's own share under ``own``), nothing counted twice;
- the ``subagent.spawn`` result the parent's model reads carries the child subtree's ``usage``;
- a reply cut mid-stream (the deadline, a drain's end, a parent's cancel) is counted from what the gateway had
  streamed: its usage when the gateway sent it, else an estimate, marked ``estimated_tokens``; a drained run's
  document says ``done: true`` like every other end state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from typing import Any

import attrs
import pytest
import trio

from tests.integration.agents import AGENTD, events_of, run_agentd
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.peers.tcpqueues import clients_have_read
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]


def _doc(done: Any) -> dict[str, Any]:
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, (done.stdout, done.stderr.decode()[-3000:])
    return dict(json.loads(lines[0]))


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def test_the_root_stops_at_the_reply_that_crosses_the_token_ceiling() -> None:
    # Were the ceiling ignored, the tool call would run and a second model request would follow.
    first = {**tool_call("resource_read", {"uri": "file:///none"}),
             "usage": {"prompt_tokens": 500, "completion_tokens": 100}}
    async with scripted_gateway([first], default=text("should never be asked")) as gw:
        done = await run_agentd(["--instruction", "spend a lot", "--intelligence", gw.url,
                                 "--token-ceiling", "150"])
        requests = len(gw.requests)
    doc = _doc(done)
    assert done.returncode == 7, (doc, done.stderr.decode()[-3000:])
    assert doc["status"] == "exhausted_tokens" and doc["partial"] is True and doc["done"] is True, doc
    assert requests == 1
    assert doc["steps"] == 1
    assert doc["usage"]["total_tokens"] == 600 and doc["usage"]["own"] == _usage(500, 100), doc
    budget = [e for e in events_of(done) if e.get("event") == "loop.budget"]
    assert budget and budget[0]["budget"] == "token_ceiling", budget


def _tree_reply(deep: bool) -> Any:
    """The root spawns one child (which, ``deep``, spawns a grandchild first); each answers; the root finishes."""

    def reply(request: RecordedRequest) -> dict[str, Any]:
        said = " ".join(str(m.get("content")) for m in request.messages)
        observed = any(m.get("role") == "tool" for m in request.messages)
        if "GRANDCHILD TASK" in said:
            return text("grandchild answer", usage={"prompt_tokens": 20, "completion_tokens": 3})
        if "CHILD TASK" in said:
            if deep and not observed:
                return {**tool_call("subagent_spawn", {"instruction": "GRANDCHILD TASK: answer"}),
                        "usage": {"prompt_tokens": 40, "completion_tokens": 7}}
            return text("child answer", usage={"prompt_tokens": 30, "completion_tokens": 4} if deep
                        else {"prompt_tokens": 40, "completion_tokens": 7})
        if observed:
            return text("root answer", usage={"prompt_tokens": 200, "completion_tokens": 20})
        return {**tool_call("subagent_spawn", {"instruction": "CHILD TASK: answer"}),
                "usage": {"prompt_tokens": 100, "completion_tokens": 10}}

    return reply


@pytest.mark.parametrize("deep", [False, True], ids=["child", "grandchild"])
async def test_the_result_usage_is_the_whole_trees_and_the_spawn_result_carries_the_childs(deep: bool) -> None:
    async with scripted_gateway(default=_tree_reply(deep)) as gw:
        done = await run_agentd(["--instruction", "delegate", "--intelligence", gw.url])
        requests = list(gw.requests)
    doc = _doc(done)
    assert done.returncode == 0 and doc["status"] == "completed", (doc, done.stderr.decode()[-3000:])
    assert len(requests) == (5 if deep else 3)
    # the subtree below the root: the child's 40+7 (deep: 40+7 and 30+4, and the grandchild's 20+3)
    child = _usage(90, 14) if deep else _usage(40, 7)
    # the root's own 100+10 and 200+20, and the subtree, each once
    assert doc["usage"]["own"] == _usage(300, 30), doc
    assert {k: doc["usage"][k] for k in child} == _usage(300 + child["prompt_tokens"],
                                                         30 + child["completion_tokens"]), doc
    # the spawn result the root's model read carries the child subtree's usage
    observation = next(m for m in requests[-1].messages if m.get("role") == "tool")
    spawned = json.loads(observation["content"])
    assert spawned["status"] == "completed" and spawned["usage"] == child, spawned
    assert "estimated_tokens" not in doc["usage"]


@attrs.frozen
class ReadThrough:
    """Until a stalled reply has been sent (``stalled``, set by the gateway's ``on_stall``) and its client, the
    real agentd, has read every byte of it (tests/peers/tcpqueues.py): what is cut after this is cut after the
    whole of the streamed part, however slow the machine (sent is not yet read). A reply's ``wait`` too."""

    stalled: trio.Event
    port: int

    async def wait(self) -> None:
        await self.stalled.wait()
        await until(lambda: clients_have_read(self.port), timeout=60, what="the stalled reply read by its client")


def _request_tokens(request: RecordedRequest) -> int:
    """The estimate of a request's prompt: its body as agentd sent it (compact JSON), 4 characters a token."""
    body = json.dumps(request.body, ensure_ascii=False, separators=(",", ":")).encode()
    return -(-len(body) // 4)


async def test_a_reply_cut_by_the_deadline_counts_what_was_streamed_as_an_estimate() -> None:
    # 1 role event, then 6 of the 40-character pieces: 240 characters streamed (60 tokens), then nothing more.
    stalled = {**text("x" * 400, chunk=40), "stall": 7, "usage": None}
    async with scripted_gateway([stalled]) as gw:
        done = await run_agentd(["--instruction", "think long", "--intelligence", gw.url, "--stream-intelligence",
                                 "--deadline", "10s"])
        requests = list(gw.requests)
    doc = _doc(done)
    assert done.returncode == 7 and doc["status"] == "deadline", (doc, done.stderr.decode()[-3000:])
    assert len(requests) == 1
    prompt = _request_tokens(requests[0])
    own = {**_usage(prompt, 60), "estimated_tokens": prompt + 60}
    assert doc["usage"]["own"] == own and {k: doc["usage"][k] for k in own} == own, doc
    cut = [e for e in events_of(done) if e.get("event") == "loop.cut_reply"]
    assert cut and cut[0]["estimated"] is True and cut[0]["completion_tokens"] == 60, cut


async def test_a_subagent_cut_by_the_drains_end_counts_the_usage_its_gateway_had_sent() -> None:
    """SIGTERM while the child's reply is mid-stream; ``--drain-timeout`` then cancels the tree. The child's cut
    reply counts with the usage the gateway had streamed (not an estimate), and the "cancelled" document (done, like
    every end state) carries the whole tree's usage."""
    stalled = trio.Event()

    def reply(request: RecordedRequest) -> dict[str, Any]:
        if "CHILD TASK" in " ".join(str(m.get("content")) for m in request.messages):
            return {**text("y" * 100, chunk=10), "stall": 4, "usage_first": True,
                    "usage": {"prompt_tokens": 70, "completion_tokens": 3}}
        return {**tool_call("subagent_spawn", {"instruction": "CHILD TASK: answer slowly"}),
                "usage": {"prompt_tokens": 100, "completion_tokens": 10}}

    async with scripted_gateway(default=reply) as gw:
        gw.app.on_stall = lambda request: stalled.set()
        argv = [*AGENTD, "--instruction", "delegate", "--intelligence", gw.url, "--stream-intelligence",
                "--drain-timeout", "1"]
        proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        out = bytearray()
        try:
            async with trio.open_nursery() as nursery:
                async def read() -> None:
                    assert proc.stdout is not None
                    async for chunk in proc.stdout:
                        out.extend(chunk)

                nursery.start_soon(read)
                with trio.fail_after(60):
                    await ReadThrough(stalled, gw.port).wait()  # the child has read the usage the gateway sent
                    proc.send_signal(signal.SIGTERM)
                    code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert code == 0  # a clean drain
    doc = json.loads(out.decode())
    assert doc["status"] == "cancelled" and doc["done"] is True, doc
    assert doc["usage"]["own"] == _usage(100, 10), doc
    assert doc["usage"] == {**_usage(170, 13), "own": _usage(100, 10)}, doc  # the child's 70+3, not estimated


async def test_a_subagent_cancelled_mid_reply_reports_an_estimate_the_parent_sees() -> None:
    """The root cancels its async child while the child's reply is mid-stream (no usage sent): the cancel result
    the root's model reads carries the child's estimated tokens, and so does the run's usage, marked."""
    stalled = trio.Event()
    streamed: ReadThrough | None = None

    def reply(request: RecordedRequest) -> dict[str, Any]:
        said = " ".join(str(m.get("content")) for m in request.messages)
        tools = [m for m in request.messages if m.get("role") == "tool"]
        if "CHILD TASK" in said:
            return {**text("z" * 200, chunk=20), "stall": 5, "usage": None}  # 4 pieces: 80 characters
        if not tools:
            return {**tool_call("subagent_spawn", {"instruction": "CHILD TASK: think", "async": True}),
                    "usage": {"prompt_tokens": 100, "completion_tokens": 10}}
        if len(tools) == 1:  # asked once the child's reply is mid-stream, and answered once the child read it
            return {**tool_call("subagent_cancel", {"handle": "0.1"}), "wait": streamed,
                    "usage": {"prompt_tokens": 100, "completion_tokens": 10}}
        return text("cancelled it", usage={"prompt_tokens": 100, "completion_tokens": 10})

    async with scripted_gateway(default=reply) as gw:
        gw.app.on_stall = lambda request: stalled.set()
        streamed = ReadThrough(stalled, gw.port)
        done = await run_agentd(["--instruction", "delegate then stop", "--intelligence", gw.url,
                                 "--stream-intelligence"])
        requests = list(gw.requests)
    doc = _doc(done)
    assert done.returncode == 0 and doc["status"] == "completed", (doc, done.stderr.decode()[-3000:])
    child_request = next(r for r in requests if "CHILD TASK" in " ".join(str(m.get("content")) for m in r.messages))
    prompt = _request_tokens(child_request)
    child = {**_usage(prompt, 20), "estimated_tokens": prompt + 20}
    cancelled = json.loads([m for m in requests[-1].messages if m.get("role") == "tool"][-1]["content"])
    assert cancelled["status"] == "cancelled" and cancelled["usage"] == child, cancelled
    assert doc["usage"] == {**_usage(300 + prompt, 30 + 20), "estimated_tokens": prompt + 20,
                            "own": _usage(300, 30)}, doc
