"""The served surface over the legacy wire: the five tools, agent:// resources, the emission rule, limits."""

from __future__ import annotations

import json

import httpx
import jsonschema
import trio

from agentd.config.load import load_config
from agentd.mcp.sse import SseDecoder
from agentd.selfmcp.surface import SelfMcpLimits
from tests.selfmcp.harness import LegacyPeer, read_events, serving

SPAWN_SCHEMA = {
    "type": "object",
    "properties": {
        "instruction": {"type": "string"},
        "output_contract": {"type": "string"},
        "tool_scope": {"type": "array", "items": {"type": "string"}},
        "async": {"type": "boolean", "default": False},
        "warm": {"type": "boolean", "default": False},
        "model": {"type": "string"},
    },
    "required": ["instruction"],
}


async def _peer(client: httpx.AsyncClient, url: str) -> LegacyPeer:
    peer = LegacyPeer(client, url)
    await peer.initialize()
    return peer


async def _tool(peer: LegacyPeer, name: str, arguments: dict) -> dict:
    return (await peer.call("tools/call", {"name": name, "arguments": arguments}))["result"]


async def test_tools_list_is_exactly_five_with_2020_12_schemas() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        peer = await _peer(client, s.url)
        tools = (await peer.call("tools/list"))["result"]["tools"]
        assert [t["name"] for t in tools] == ["status", "subagent.spawn", "subagent.send", "subagent.status",
                                              "subagent.cancel"]
        spawn = tools[1]
        assert spawn["inputSchema"] == SPAWN_SCHEMA
        for tool in tools:
            jsonschema.Draft202012Validator.check_schema(tool["inputSchema"])
            jsonschema.Draft202012Validator.check_schema(tool["outputSchema"])
            assert tool["description"]


async def test_sync_spawn_returns_distilled_result_matching_output_schema() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        peer = await _peer(client, s.url)
        tools = {t["name"]: t for t in (await peer.call("tools/list"))["result"]["tools"]}
        result = await _tool(peer, "subagent.spawn", {"instruction": "review sleep=0.1", "tool_scope": ["fs"]})
        assert result["isError"] is False
        sc = result["structuredContent"]
        assert sc == {"handle": "served.1", "status": "completed", "done": True, "partial": False,
                      "result": {"echo": "review sleep=0.1", "messages": []}}
        assert json.loads(result["content"][0]["text"]) == sc
        jsonschema.validate(sc, tools["subagent.spawn"]["outputSchema"])
        assert s.backend.spawned[0].tool_scope == ("fs",)


async def test_unknown_tool_bad_arguments_and_refusal() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        peer = await _peer(client, s.url)
        r = await peer.call("tools/call", {"name": "shell", "arguments": {}})
        assert r["error"]["code"] == -32601
        r = await peer.call("tools/call", {"name": "subagent.spawn", "arguments": {"instruction": 5}})
        assert r["error"]["code"] == -32602
        r = await peer.call("tools/call", {"name": "subagent.spawn", "arguments": {}})
        assert r["error"]["code"] == -32602
        r = await peer.call("tools/call", {"name": "subagent.spawn", "arguments": {"instruction": "refuse"}})
        assert r["result"]["isError"] is True
        assert r["result"]["content"][0]["text"].startswith("spawn refused")
        r = await peer.call("no/such/method")
        assert r["error"]["code"] == -32601


async def test_status_tool_and_status_resource() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        peer = await _peer(client, s.url)
        listed = (await peer.call("resources/list"))["result"]["resources"]
        assert [r["uri"] for r in listed] == ["agent://status"]
        status = (await _tool(peer, "status", {}))["structuredContent"]
        assert status["run_id"] == "run-test" and status["mode"] == "loop" and status["pid"] > 0
        read = (await peer.call("resources/read", {"uri": "agent://status"}))["result"]["contents"][0]
        body = json.loads(read["text"])
        assert read["mimeType"] == "application/json"
        assert set(body) == {"run_id", "mode", "version", "pid", "uptime_ms", "spawns", "refusals"}


async def test_async_spawn_read_running_then_terminal_and_unknown() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        peer = await _peer(client, s.url)
        ack = (await _tool(peer, "subagent.spawn", {"instruction": "sleep=0.3", "async": True}))["structuredContent"]
        assert ack == {"handle": "served.1", "status": "running", "done": False}
        uri = "agent://subagent/served.1"
        running = json.loads((await peer.call("resources/read", {"uri": uri}))["result"]["contents"][0]["text"])
        assert set(running) == {"handle", "status", "done", "age_ms"} and running["done"] is False
        status = (await _tool(peer, "subagent.status", {"handle": "served.1"}))["structuredContent"]
        assert status["done"] is False
        with trio.fail_after(5):
            await s.backend.runs["served.1"].done.wait()
            await s.surface.runs["served.1"].finished.wait()
        done = json.loads((await peer.call("resources/read", {"uri": uri}))["result"]["contents"][0]["text"])
        assert done == {"handle": "served.1", "status": "completed", "done": True, "partial": False,
                        "result": {"echo": "sleep=0.3", "messages": []}}
        missing = await peer.call("resources/read", {"uri": "agent://subagent/served.99"})
        assert missing["error"]["code"] == -32002
        assert missing["error"]["data"] == {"uri": "agent://subagent/served.99"}


async def test_warm_session_send_and_cancel() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        peer = await _peer(client, s.url)
        ack = (await _tool(peer, "subagent.spawn", {"instruction": "be warm", "warm": True}))["structuredContent"]
        handle = ack["handle"]
        sent = await _tool(peer, "subagent.send", {"handle": handle, "message": "hello"})
        assert sent["structuredContent"] == {"handle": handle, "accepted": True}
        cancelled = await _tool(peer, "subagent.cancel", {"handle": handle})
        assert cancelled["structuredContent"]["status"] == "cancelled"
        assert cancelled["structuredContent"]["done"] is True
        again = await _tool(peer, "subagent.send", {"handle": handle, "message": "late"})
        assert again["isError"] is True
        unknown = await _tool(peer, "subagent.cancel", {"handle": "served.42"})
        assert unknown["isError"] is True


async def test_concurrent_spawn_cap_refuses_fifth() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        peer = await _peer(client, s.url)
        handles = []
        for _ in range(4):
            r = await _tool(peer, "subagent.spawn", {"instruction": "sleep=5", "async": True})
            handles.append(r["structuredContent"]["handle"])
        fifth = await _tool(peer, "subagent.spawn", {"instruction": "sleep=5", "async": True})
        assert fifth["isError"] is True and "4 served spawns" in fifth["content"][0]["text"]
        await _tool(peer, "subagent.cancel", {"handle": handles[0]})
        sixth = await _tool(peer, "subagent.spawn", {"instruction": "sleep=0", "async": True})
        assert sixth["isError"] is False


async def test_warm_cap() -> None:
    async with serving(limits=SelfMcpLimits(max_warm=2)) as s, httpx.AsyncClient() as client:
        peer = await _peer(client, s.url)
        for _ in range(2):
            assert (await _tool(peer, "subagent.spawn", {"instruction": "w", "warm": True}))["isError"] is False
        third = await _tool(peer, "subagent.spawn", {"instruction": "w", "warm": True})
        assert third["isError"] is True and "warm" in third["content"][0]["text"]


async def test_updated_goes_only_to_subscribers_once_then_consumed() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        watcher = await _peer(client, s.url)
        bystander = await _peer(client, s.url)
        h1 = (await _tool(watcher, "subagent.spawn", {"instruction": "sleep=0.2", "async": True}))
        h2 = (await _tool(watcher, "subagent.spawn", {"instruction": "sleep=0.2", "async": True}))
        u1 = f"agent://subagent/{h1['structuredContent']['handle']}"
        await watcher.call("resources/subscribe", {"uri": u1})
        with trio.fail_after(5):
            for run in list(s.surface.runs.values()):
                await run.finished.wait()
        sessions = s.app.core.sessions
        watcher_events = [json.loads(d[d.index(b"data: ") + 6:].decode()) for _, d in sessions[watcher.session].events]
        assert watcher_events == [{"jsonrpc": "2.0", "method": "notifications/resources/updated",
                                   "params": {"uri": u1}}]
        assert list(sessions[bystander.session].events) == []
        assert s.surface.subscriptions.count() == 0  # consumed
        assert h2["isError"] is False


async def test_subscribe_to_terminal_handle_updates_at_once_and_unknown_is_32002() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        peer = await _peer(client, s.url)
        await _tool(peer, "subagent.spawn", {"instruction": "sleep=0", "async": False})
        r = await peer.call("resources/subscribe", {"uri": "agent://subagent/served.1"})
        assert r["result"] == {}
        decoder = SseDecoder()
        with trio.fail_after(5):
            async with client.stream("GET", s.url, headers={**peer.headers(), "accept": "text/event-stream"}) as g:
                events = await read_events(g.aiter_bytes(), decoder, 1)
        assert json.loads(next(e for e in events if e.data).data)["params"]["uri"] == "agent://subagent/served.1"
        bad = await peer.call("resources/subscribe", {"uri": "agent://subagent/served.7"})
        assert bad["error"]["code"] == -32002


async def test_retention_evicts_terminal_handles(autojump_clock: object) -> None:
    # pure in-process: the surface against the backend, no sockets, so the clock can jump
    from agentd.mcp.jsonrpc import Request
    from agentd.mcp.versions import Era
    from agentd.selfmcp.surface import AgentInfo, SelfMcpSurface
    from agentd.transport.asgi_server import CallContext
    from tests.selfmcp.backend import TaskBackend

    async with trio.open_nursery() as nursery:
        surface = SelfMcpSurface(TaskBackend(nursery), AgentInfo("r", "loop"), limits=SelfMcpLimits(retention=60))
        await nursery.start(surface.run)
        ctx = CallContext(Era.LEGACY, "s", lambda uri: None)
        spawn = Request(1, "tools/call", {"name": "subagent.spawn", "arguments": {"instruction": "sleep=1"}})
        reply = await surface.handle(spawn, ctx)
        assert reply.result["structuredContent"]["done"] is True
        read = Request(2, "resources/read", {"uri": "agent://subagent/served.1"})
        await trio.sleep(59)
        assert "contents" in (await surface.handle(read, ctx)).result
        await trio.sleep(2)
        gone = await surface.handle(read, ctx)
        assert gone.code == -32002
        nursery.cancel_scope.cancel()


class _SlowToDie:
    """A backend whose cancel takes 20 s to finish (a child that needs its whole ``--cancel-grace``)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        from tests.selfmcp.backend import TaskBackend

        self.inner = TaskBackend(nursery)
        self.cancel_finished = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def cancel(self, handle: str) -> object:
        await trio.sleep(20)  # virtual time: a slow cancel, in the autojump_clock test below
        view = await self.inner.cancel(handle)
        self.cancel_finished = True
        return view


async def test_disconnect_cancel_waits_the_configured_cancel_grace(autojump_clock: object) -> None:
    # --cancel-grace reaches the served surface: a peer that disconnects from a sync spawn cancels the run,
    # and the surface waits up to --cancel-grace (30 s here) for it to end, not a fixed 5 s of its own.
    from agentd.mcp.jsonrpc import Request
    from agentd.mcp.versions import Era
    from agentd.selfmcp.serving import build_app
    from agentd.telemetry.events import null_log
    from agentd.transport.asgi_server import CallContext
    from agentd.transport.serve import ServeConfig

    config = load_config(["--intelligence", "test", "--instruction", "x", "--mode", "loop", "--interval", "1s",
                               "--serve-mcp", "http://127.0.0.1:0/mcp", "--cancel-grace", "30s"], env={})
    async with trio.open_nursery() as nursery:
        backend = _SlowToDie(nursery)
        surface, _ = build_app(config, backend, ServeConfig(url=config.serve.mcp or ""), null_log())  # type: ignore[arg-type]
        await nursery.start(surface.run)
        ctx = CallContext(Era.MODERN, "s", None, cancel_on_disconnect=True)
        spawn = Request(1, "tools/call", {"name": "subagent.spawn", "arguments": {"instruction": "sleep=100"}})
        with trio.move_on_after(1):  # the peer goes away after a second
            await surface.handle(spawn, ctx)
        assert backend.inner.cancelled == ["served.1"]
        assert backend.cancel_finished
        nursery.cancel_scope.cancel()
