"""Random requests against the ASGI app in memory: it always answers with an HTTP status, never raises."""

from __future__ import annotations

import json

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentd.selfmcp.surface import AgentInfo, SelfMcpSurface
from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
from tests.selfmcp.backend import TaskBackend
from tests.selfmcp.test_asgi_clock import Exchange

METHODS = st.sampled_from(["POST", "GET", "DELETE", "PUT"])
VERSIONS = st.sampled_from([None, "2025-11-25", "2025-03-26", "2026-07-28", "2099-01-01", "garbage"])
RPC_METHODS = st.sampled_from(["initialize", "ping", "tools/list", "tools/call", "resources/read",
                               "resources/subscribe", "subscriptions/listen", "server/discover", "nope"])
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                     max_size=3), max_leaves=8)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=64))
    message: dict = {"jsonrpc": draw(st.sampled_from(["2.0", "1.0"])), "method": draw(RPC_METHODS)}
    if draw(st.booleans()):
        message["id"] = draw(st.one_of(st.integers(), st.text(max_size=4), st.none()))
    params = draw(st.one_of(st.none(), st.dictionaries(st.sampled_from(["name", "uri", "arguments", "_meta",
                                                                       "protocolVersion", "notifications"]),
                                                       JSONISH, max_size=4)))
    if params is not None:
        message["params"] = params
    if kind == 3:
        return json.dumps([message, message]).encode()
    return json.dumps(message).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(METHODS, VERSIONS, st.booleans(), st.sampled_from([None, "tools/list", "tools/call"]), bodies())
def test_any_request_gets_an_http_answer(method: str, version: str | None, with_session: bool,
                                         mcp_method: str | None, body: bytes) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            surface = SelfMcpSurface(TaskBackend(nursery), AgentInfo("r", "loop"))
            await nursery.start(surface.run)
            app = McpAsgiApp(surface, AsgiOptions(keepalive=0.05))
            headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
            if with_session:
                init = Exchange("POST", headers, json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                                             "params": {"protocolVersion": "2025-03-26"}}).encode())
                await app(init.scope, init.receive, init.send)
                headers["mcp-session-id"] = dict(init.sent[0]["headers"])[b"mcp-session-id"].decode()
            if version is not None:
                headers["mcp-protocol-version"] = version
            if mcp_method is not None:
                headers["mcp-method"] = mcp_method
            ex = Exchange(method, headers, body)
            with trio.move_on_after(0.5):  # streams (GET, listen) stay open: stop watching them
                await app(ex.scope, ex.receive, ex.send)
            assert ex.sent, "no answer at all"
            assert ex.sent[0]["type"] == "http.response.start"
            assert 200 <= ex.status() < 600
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
