"""Tool calls a server runs as tasks (agentd.mcp.tasks, agentd.client.tasks), on both wires, against scripted
in-process peers on loopback; the waits between polls on trio's autojump clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.errors import McpError, McpRpcError, McpTransportError
from tests.client.fakeserver import INIT_RESULT, Req, Resp, error, mcp_answer, result, serve_fake
from tests.client.helpers import Events, server
from tests.client.test_modern_scripted import modern_peer

EXT = "io.modelcontextprotocol/tasks"
TOOLS = [
    {"name": "research", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "required"}},
    {"name": "maybe", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}},
]
TASK_CAPS = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


def params_of(req: Req) -> dict[str, Any]:
    params = req.json.get("params") or {}
    assert isinstance(params, dict)
    return params


class LegacyTaskPeer:
    """A 2025-11-25 server whose ``research`` tool runs only as a task: ``working`` for ``polls`` tasks/get
    (``pollInterval`` ``interval_ms``), then ``completed``. Records when each tasks/get arrived."""

    def __init__(self, *, polls: int = 3, interval_ms: int = 5000, capabilities: dict[str, Any] | None = None,
                 tools: list[dict[str, Any]] | None = None) -> None:
        self.polls, self.interval_ms = polls, interval_ms
        self.capabilities = {"tools": {}, "tasks": TASK_CAPS} if capabilities is None else capabilities
        self.tools = TOOLS if tools is None else tools
        self.gets: list[float] = []
        self.cancelled: list[str] = []

    def task(self, status: str, message: str | None = None) -> dict[str, Any]:
        task = {"taskId": "task-1", "status": status, "createdAt": "2026-12-06T00:00:00Z",
                "lastUpdatedAt": "2026-12-06T00:00:00Z", "ttl": 60000, "pollInterval": self.interval_ms}
        if message:
            task["statusMessage"] = message
        return task

    async def __call__(self, req: Req, resp: Resp) -> None:
        method = req.rpc_method
        if method == "initialize":
            await resp.json(result(req, {**INIT_RESULT, "capabilities": self.capabilities}),
                            headers={"mcp-session-id": "s-1"})
        elif method == "tools/list":
            await resp.json(result(req, {"tools": self.tools}))
        elif method == "tools/call" and params_of(req)["name"] == "research":
            if "task" not in params_of(req):
                await resp.json(error(req, -32601, "research requires task augmentation"))
            else:
                await resp.json(result(req, {"task": self.task("working", "Gathering sources...")}))
        elif method == "tasks/get" and params_of(req) != {"taskId": "task-1"}:
            await resp.json(error(req, -32602, "Failed to retrieve task: Task not found"))
        elif method == "tasks/get":
            self.gets.append(trio.current_time())
            done = len(self.gets) > self.polls
            await resp.json(result(req, self.task("completed" if done else "working",
                                                  None if done else f"stage {len(self.gets)}")))
        elif method == "tasks/result":
            assert len(self.gets) > self.polls, "tasks/result before the task was terminal"
            await resp.json(result(req, {"content": [{"type": "text", "text": "the report"}],
                                         "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "task-1"}}}))
        elif method == "tasks/cancel":
            self.cancelled.append(params_of(req)["taskId"])
            await resp.json(result(req, self.task("cancelled")))
        else:
            await mcp_answer(req, resp)


async def test_a_required_tool_is_called_as_a_task_polled_at_the_servers_interval(
    autojump_clock: trio.abc.Clock,
) -> None:
    peer = LegacyTaskPeer(polls=3, interval_ms=5000)
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, peer)
        async with open_mcp_pool([server(fake.url, call_timeout=60)], log=events.log) as pool:
            assert {t.name for t in pool.tools()} == {"research", "maybe"}
            with trio.fail_after(60):
                start = trio.current_time()
                got = await pool.call_tool("s", "research", {"topic": "x"})
                plain = await pool.call_tool("s", "maybe", {})
        nursery.cancel_scope.cancel()
    assert got.content == [{"type": "text", "text": "the report"}] and not got.is_error
    assert plain.content == [{"type": "text", "text": "ok"}]
    # The handshake is unchanged: a requestor needs no client capability.
    init = next(r for r in fake.requests if r.rpc_method == "initialize")
    assert params_of(init)["capabilities"] == {}
    calls = [params_of(r) for r in fake.requests if r.rpc_method == "tools/call"]
    assert calls[0]["name"] == "research" and calls[0]["task"] == {"ttl": 3_600_000}
    assert calls[1]["name"] == "maybe" and "task" not in calls[1]  # optional: called plainly
    # Four polls, each the server's 5 s after the one before (the first 5 s after the call).
    assert len(peer.gets) == 4
    gaps = [b - a for a, b in zip([start, *peer.gets], peer.gets, strict=False)]
    assert all(gap >= 5 for gap in gaps) and all(gap < 6 for gap in gaps)
    assert fake.methods().count("tasks/result") == 1 and not peer.cancelled
    statuses = [(e["status"], e["message"]) for e in events.named("mcp.task")]
    assert statuses == [("working", "Gathering sources..."), ("working", "stage 1"), ("working", "stage 2"),
                        ("working", "stage 3"), ("completed", None)]


async def test_the_call_timeout_bounds_the_task_and_cancels_it(autojump_clock: trio.abc.Clock) -> None:
    peer = LegacyTaskPeer(polls=1000, interval_ms=5000)
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, peer)
        async with open_mcp_pool([server(fake.url, call_timeout=30)], log=events.log) as pool:
            with trio.fail_after(60), pytest.raises(McpTransportError) as info:
                await pool.call_tool("s", "research", {})
            assert info.value.timed_out
        nursery.cancel_scope.cancel()
    assert peer.cancelled == ["task-1"]
    assert 4 <= len(peer.gets) <= 6  # polled at the server's interval until the 30 s call timeout
    assert [e["task_id"] for e in events.named("mcp.task_cancelled")] == ["task-1"]


async def test_cancelling_the_caller_cancels_the_task(autojump_clock: trio.abc.Clock) -> None:
    peer = LegacyTaskPeer(polls=1000, interval_ms=1000)
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, peer)
        async with open_mcp_pool([server(fake.url, call_timeout=600)], log=Events().log) as pool:
            with trio.move_on_after(10) as run_deadline:  # the run's deadline, nearer than the call timeout
                await pool.call_tool("s", "research", {})
            assert run_deadline.cancelled_caught
        nursery.cancel_scope.cancel()
    assert peer.cancelled == ["task-1"]


async def test_a_required_tool_is_not_offered_when_the_server_cannot_run_tasks() -> None:
    peer = LegacyTaskPeer(capabilities={"tools": {}})
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, peer)
        async with open_mcp_pool([server(fake.url)], log=events.log) as pool:
            assert [t.name for t in pool.tools()] == ["maybe"]
            assert set(pool.connections["s"].catalogue.unusable) == {"research"}
            with trio.fail_after(10), pytest.raises(McpError, match="taskSupport"):
                await pool.call_tool("s", "research", {})
        nursery.cancel_scope.cancel()
    assert "tools/call" not in fake.methods()
    assert [e["tool"] for e in events.named("mcp.tool_unusable")] == ["research"]


async def test_a_resumed_call_polls_its_task_and_never_calls_the_tool(autojump_clock: trio.abc.Clock) -> None:
    peer = LegacyTaskPeer(polls=1, interval_ms=1000)
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, peer)
        async with open_mcp_pool([server(fake.url)], log=events.log) as pool:
            with trio.fail_after(60):
                got = await pool.call_tool("s", "research", {}, resume_task="task-1")
                with pytest.raises(McpError, match=r"unknown to the server.*not called again"):
                    await pool.call_tool("s", "research", {}, resume_task="task-expired")
        nursery.cancel_scope.cancel()
    assert got.content == [{"type": "text", "text": "the report"}]
    assert "tools/call" not in fake.methods() and not peer.cancelled
    assert [e["task_id"] for e in events.named("mcp.task_resumed")] == ["task-1", "task-expired"]


# -- the 2026-07-28 wire (the tasks extension, SEP-2663) ---------------------------------------------------


class ModernTaskPeer:
    """A handshake-less server that answers ``research`` with a task handle: ``working``, then
    ``input_required`` (an elicitation and a sampling request it does not need, both keyed), then, once
    ``tasks/update`` answered, ``completed`` with the result inline (or ``failed`` when ``fail``)."""

    def __init__(self, *, fail: bool = False, interval_ms: int = 2000) -> None:
        self.fail, self.interval_ms = fail, interval_ms
        self.gets: list[float] = []
        self.updates: list[dict[str, Any]] = []
        self.base = modern_peer(overrides={"tools/list": {"tools": TOOLS[:1]}})

    def task(self, status: str, **extra: Any) -> dict[str, Any]:
        return {"taskId": "t-9", "status": status, "createdAt": "2026-12-06T00:00:00Z",
                "lastUpdatedAt": "2026-12-06T00:00:00Z", "ttlMs": 60000, "pollIntervalMs": self.interval_ms,
                **extra}

    async def __call__(self, req: Req, resp: Resp) -> None:
        method = req.rpc_method
        if req.method == "POST" and method in ("tools/call", "tasks/get", "tasks/update"):
            caps = params_of(req)["_meta"]["io.modelcontextprotocol/clientCapabilities"]
            assert caps == {"extensions": {EXT: {}}}
            if method != "tools/call":
                assert req.headers["mcp-name"] == "t-9"
        if method == "tools/call":
            await resp.json(result(req, {"resultType": "task", **self.task("working")}))
        elif method == "tasks/get":
            self.gets.append(trio.current_time())
            if len(self.gets) == 1:
                body = self.task("working")
            elif not self.updates:
                body = self.task("input_required", inputRequests={
                    "confirm": {"method": "elicitation/create", "params": {"message": "sure?", "requestedSchema": {}}},
                    "roots": {"method": "roots/list", "params": {}}})
            elif self.fail:
                body = self.task("failed", error={"code": -32603, "message": "rate limited"})
            else:
                body = self.task("completed", result={"content": [{"type": "text", "text": "done"}],
                                                      "isError": False})
            await resp.json(result(req, {"resultType": "complete", **body}))
        elif method == "tasks/update":
            self.updates.append(params_of(req))
            await resp.json(result(req, {"resultType": "complete"}))
        else:
            await self.base(req, resp)


@pytest.mark.parametrize("fail", [False, True])
async def test_modern_task_polled_answered_and_finished(autojump_clock: trio.abc.Clock, fail: bool) -> None:
    peer = ModernTaskPeer(fail=fail)
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, peer)
        async with open_mcp_pool([server(fake.url, era="modern")], log=events.log) as pool:
            with trio.fail_after(60):
                start = trio.current_time()
                if fail:
                    with pytest.raises(McpRpcError) as info:
                        await pool.call_tool("s", "research", {})
                    assert info.value.code == -32603 and "rate limited" in str(info.value)
                else:
                    got = await pool.call_tool("s", "research", {})
                    assert got.content == [{"type": "text", "text": "done"}]
        nursery.cancel_scope.cancel()
    call = next(params_of(r) for r in fake.requests if r.rpc_method == "tools/call")
    assert "task" not in call  # the modern wire: the server alone decides
    # answered once (the same keys seen again are not answered twice), with agentd's refusals
    assert len(peer.updates) == 1
    assert peer.updates[0]["taskId"] == "t-9"
    assert peer.updates[0]["inputResponses"] == {"confirm": {"action": "decline"}, "roots": {"roots": []}}
    gaps = [b - a for a, b in zip([start, *peer.gets], peer.gets, strict=False)]
    assert len(peer.gets) == 3 and all(2 <= gap < 3 for gap in gaps)
    assert "tasks/cancel" not in fake.methods() and "tasks/result" not in fake.methods()
    assert [e["status"] for e in events.named("mcp.task")] == ["working", "input_required",
                                                              "failed" if fail else "completed"]
