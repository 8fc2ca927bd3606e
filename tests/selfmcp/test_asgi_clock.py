"""The ASGI app driven in memory (no sockets) so time-based behaviour runs on trio's autojump clock:
SSE keepalives every 15 s, the body timeout, the final listen frame on drain, and streaming decided by
the handler (``McpHandler.streams``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import trio

from agentd.mcp.jsonrpc import ErrorResponse, Request, Response
from agentd.mcp.server_session import ServerIdentity
from agentd.mcp.sse import SseDecoder
from agentd.selfmcp.surface import AgentInfo, SelfMcpSurface
from agentd.transport.asgi_server import AsgiOptions, CallContext, ListenTicket, McpAsgiApp
from tests.selfmcp.backend import TaskBackend
from tests.selfmcp.harness import modern_headers, modern_meta, rpc


class Exchange:
    """One in-memory HTTP exchange: feed the request, collect what the app sends."""

    def __init__(self, method: str, headers: dict[str, str], body: bytes = b"", *, hold_body: bool = False) -> None:
        self.scope: dict[str, Any] = {
            "type": "http", "method": method, "path": "/mcp",
            "headers": [(k.encode(), v.encode()) for k, v in {"host": "127.0.0.1:1", **headers}.items()],
        }
        self.body = body
        self.hold_body = hold_body
        self.sent: list[dict[str, Any]] = []
        self.disconnect = trio.Event()
        self._delivered = False
        self.chunk = trio.Event()

    async def receive(self) -> dict[str, Any]:
        if not self._delivered:
            self._delivered = True
            if self.hold_body:
                await trio.sleep_forever()
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        self.chunk.set()
        self.chunk = trio.Event()

    def status(self) -> int:
        return int(self.sent[0]["status"])

    def stream(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


async def _app(nursery: trio.Nursery) -> McpAsgiApp:
    surface = SelfMcpSurface(TaskBackend(nursery), AgentInfo("r", "loop"))
    await nursery.start(surface.run)
    return McpAsgiApp(surface, AsgiOptions())


async def test_listen_keepalive_every_15s_and_final_frame_on_drain(autojump_clock: object) -> None:
    async with trio.open_nursery() as nursery:
        app = await _app(nursery)
        params = {"_meta": modern_meta(), "notifications": {"resourceSubscriptions": []}}
        ex = Exchange("POST", modern_headers("subscriptions/listen"), json.dumps(rpc("subscriptions/listen",
                                                                                    params, 3)).encode())
        nursery.start_soon(app, ex.scope, ex.receive, ex.send)
        await trio.sleep(14.9)
        assert ex.stream().count(b": keepalive") == 0
        await trio.sleep(0.2)
        assert ex.stream().count(b": keepalive") == 1
        await trio.sleep(30)
        assert ex.stream().count(b": keepalive") == 3
        app.drain()
        await trio.sleep(0.1)
        events = [json.loads(e.data) for e in SseDecoder().feed(ex.stream()) if e.data]
        assert events[0]["method"] == "notifications/subscriptions/acknowledged"
        assert events[-1] == {"jsonrpc": "2.0", "id": 3, "result": {
            "resultType": "complete", "_meta": {"io.modelcontextprotocol/subscriptionId": 3}}}
        assert ex.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        nursery.cancel_scope.cancel()


async def test_slow_body_is_408_after_30s(autojump_clock: object) -> None:
    async with trio.open_nursery() as nursery:
        app = await _app(nursery)
        ex = Exchange("POST", {"accept": "application/json, text/event-stream", "content-type": "application/json"},
                      hold_body=True)
        start = trio.current_time()
        await app(ex.scope, ex.receive, ex.send)
        assert ex.status() == 408
        assert 30 <= trio.current_time() - start < 31
        nursery.cancel_scope.cancel()


async def test_sync_spawn_stream_keeps_alive_then_answers(autojump_clock: object) -> None:
    async with trio.open_nursery() as nursery:
        app = await _app(nursery)
        init = Exchange("POST", {"accept": "application/json, text/event-stream", "content-type": "application/json"},
                        json.dumps(rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                                      "clientInfo": {"name": "t", "version": "0"}})).encode())
        await app(init.scope, init.receive, init.send)
        sid = dict(init.sent[0]["headers"])[b"mcp-session-id"].decode()
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json",
                   "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
        call = rpc("tools/call", {"name": "subagent.spawn", "arguments": {"instruction": "sleep=40"}}, 9)
        ex = Exchange("POST", headers, json.dumps(call).encode())
        await app(ex.scope, ex.receive, ex.send)
        events = SseDecoder().feed(ex.stream())
        assert events[0].data == "" and events[0].id is not None and events[0].retry == 2000  # priming
        assert ex.stream().count(b": keepalive") == 2  # at 15 s and 30 s; the run ended at 40 s
        answer = json.loads(events[-1].data)
        assert answer["id"] == 9 and answer["result"]["structuredContent"]["status"] == "completed"
        nursery.cancel_scope.cancel()


async def test_listen_streams_are_capped(autojump_clock: object) -> None:
    async with trio.open_nursery() as nursery:
        surface = SelfMcpSurface(TaskBackend(nursery), AgentInfo("r", "loop"))
        await nursery.start(surface.run)
        app = McpAsgiApp(surface, AsgiOptions(max_sessions=1))
        params = {"_meta": modern_meta(), "notifications": {}}
        body = json.dumps(rpc("subscriptions/listen", params, 1)).encode()
        first = Exchange("POST", modern_headers("subscriptions/listen"), body)
        nursery.start_soon(app, first.scope, first.receive, first.send)
        await trio.sleep(1)
        second = Exchange("POST", modern_headers("subscriptions/listen"), body)
        await app(second.scope, second.receive, second.send)
        assert first.status() == 200
        assert second.status() == 503
        first.disconnect.set()  # the peer closes the first stream: room again
        await trio.sleep(1)
        third = Exchange("POST", modern_headers("subscriptions/listen"), body)
        nursery.start_soon(app, third.scope, third.receive, third.send)
        await trio.sleep(1)
        assert third.status() == 200
        nursery.cancel_scope.cancel()


class SlowHandler:
    """A handler the transport has never heard of: ``slow/*`` methods take 40 s and stream, the rest don't."""

    identity = ServerIdentity("slow", "0", {})

    def streams(self, request: Request) -> bool:
        return request.method.startswith("slow/")

    async def handle(self, request: Request, ctx: CallContext) -> Response | ErrorResponse:
        await trio.sleep(40)  # virtual time: a slow handler, in the autojump_clock test below
        return Response(request.id, {"method": request.method})

    def open_stream(self, request: Request, ctx: CallContext) -> None:
        return None

    def listen(self, uris: list[str], sink: Callable[[str], None]) -> ListenTicket:
        return ListenTicket(honored=[], fire_now=[])

    def unlisten(self, ticket: ListenTicket) -> None:
        pass

    def session_closed(self, session_id: str) -> None:
        pass


async def _legacy_headers(app: McpAsgiApp) -> dict[str, str]:
    init = Exchange("POST", {"accept": "application/json, text/event-stream", "content-type": "application/json"},
                    json.dumps(rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                                  "clientInfo": {"name": "t", "version": "0"}})).encode())
    await app(init.scope, init.receive, init.send)
    sid = dict(init.sent[0]["headers"])[b"mcp-session-id"].decode()
    return {"accept": "application/json, text/event-stream", "content-type": "application/json",
            "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_handler_decides_which_requests_stream(autojump_clock: object, era: str) -> None:
    app = McpAsgiApp(SlowHandler(), AsgiOptions())
    for method, streamed in (("slow/thing", True), ("quick/thing", False)):
        if era == "legacy":
            headers, params = await _legacy_headers(app), {}
        else:
            headers, params = modern_headers(method), {"_meta": modern_meta()}
        ex = Exchange("POST", headers, json.dumps(rpc(method, params, 7)).encode())
        await app(ex.scope, ex.receive, ex.send)
        content_type = dict(ex.sent[0]["headers"])[b"content-type"]
        if not streamed:
            assert content_type == b"application/json"
            assert b"keepalive" not in ex.stream()
            assert json.loads(ex.stream())["result"]["method"] == method
            continue
        assert content_type == b"text/event-stream"
        assert ex.stream().count(b": keepalive") == 2  # at 15 s and 30 s; the answer came at 40 s
        events = [e for e in SseDecoder().feed(ex.stream()) if e.data]
        answer = json.loads(events[-1].data)
        assert answer["id"] == 7 and answer["result"]["method"] == method
        assert ex.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        if era == "legacy":
            priming = SseDecoder().feed(ex.stream())[0]
            assert priming.data == "" and priming.id is not None


async def _channel_exchange(app: McpAsgiApp, messages: list[dict[str, Any]]) -> Exchange:
    """A POST whose body arrives as hypercorn hands it over: messages already in a memory channel."""
    body = json.dumps(rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                         "clientInfo": {"name": "t", "version": "0"}}, 0)).encode()
    ex = Exchange("POST", {"content-type": "application/json", "accept": "application/json, text/event-stream",
                           "content-length": str(len(body))})
    sender, receiver = trio.open_memory_channel[dict[str, Any]](10)
    for message in messages:
        sender.send_nowait({**message, "body": body} if message.get("body") is None else message)
    await app(ex.scope, receiver.receive, ex.send)
    return ex


async def test_a_body_complete_at_its_content_length_is_answered_without_waiting_for_its_end(
        autojump_clock: object) -> None:
    """hypercorn sends the body, then an empty end-of-body message; the declared length is enough to answer."""
    async with trio.open_nursery() as nursery:
        app = await _app(nursery)
        start = trio.current_time()
        ex = await _channel_exchange(app, [{"type": "http.request", "body": None, "more_body": True}])
        assert ex.status() == 200 and trio.current_time() - start < 1
        # a body short of its Content-Length still waits, and is 408 at the body timeout
        ex = await _channel_exchange(app, [{"type": "http.request", "body": b"{", "more_body": True}])
        assert ex.status() == 408 and trio.current_time() - start >= 30
        nursery.cancel_scope.cancel()
