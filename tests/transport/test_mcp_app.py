"""agentd.transport.mcp_app through the real server, over a handler it has never heard of: MCP on POST on the
legacy wire (a session: initialize, calls carrying its id, DELETE) and the modern one (no session), the served
path with trailing slashes too, the gate before anything, and the body bounds (413, 408)."""

from __future__ import annotations

import json

import httpx
import trio

from agentd.mcp.sse import SseDecoder
from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
from tests.selfmcp.harness import modern_headers, modern_meta, rpc
from tests.transport.served import JSON, EchoHandler, served

INIT = rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                          "clientInfo": {"name": "t", "version": "0"}}, 0)


async def test_a_legacy_session_from_initialize_to_delete() -> None:
    async with served(McpAsgiApp(EchoHandler())) as s, httpx.AsyncClient() as client:
        url = f"http://127.0.0.1:{s.port}/mcp"
        init = await client.post(url, headers=JSON, json=INIT)
        assert init.status_code == 200 and init.json()["result"]["serverInfo"]["name"] == "echo"
        session = {**JSON, "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        assert (await client.post(url, headers=session, json=rpc("notifications/initialized", id=None))).status_code == 202
        for path in ("/mcp", "/mcp/", "/mcp//"):
            answer = await client.post(f"http://127.0.0.1:{s.port}{path}", headers=session, json=rpc("echo/this", {}, 5))
            assert answer.json()["result"] == {"method": "echo/this", "era": "legacy", "who": ""}
        streamed = await client.post(url, headers=session, json=rpc("slow/echo", {}, 6))  # the handler says: SSE
        assert streamed.headers["content-type"] == "text/event-stream"
        events = [e for e in SseDecoder().feed(streamed.content) if e.data]
        assert json.loads(events[-1].data)["result"]["method"] == "slow/echo"
        assert (await client.delete(url, headers=session)).status_code == 200
        assert (await client.post(url, headers=session, json=rpc("echo/this", {}, 7))).status_code == 404
        assert (await client.post(f"http://127.0.0.1:{s.port}/mcp/x", headers=JSON, json=INIT)).status_code == 404


async def test_the_modern_wire_needs_no_session() -> None:
    async with served(McpAsgiApp(EchoHandler())) as s, httpx.AsyncClient() as client:
        answer = await client.post(f"http://127.0.0.1:{s.port}/mcp", headers=modern_headers("echo/now"),
                                   json=rpc("echo/now", {"_meta": modern_meta()}, 3))
        assert answer.status_code == 200 and "mcp-session-id" not in answer.headers
        assert answer.json()["result"]["method"] == "echo/now"
        assert answer.json()["result"]["era"] == "modern"


async def test_the_gate_comes_before_the_body() -> None:
    app = McpAsgiApp(EchoHandler(), AsgiOptions(bearer="mcp-bearer", max_body=512))
    async with served(app) as s, httpx.AsyncClient() as client:
        url = f"http://127.0.0.1:{s.port}/mcp"
        refused = await client.post(url, headers=JSON, content=b"x" * 1000)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == 'Bearer realm="agentd"'
        large = await client.post(url, headers={**JSON, "authorization": "Bearer mcp-bearer"}, content=b"x" * 1000)
        assert large.status_code == 413 and "exceeds 512 bytes" in large.json()["error"]["message"]
        fine = await client.post(url, headers={**JSON, "authorization": "Bearer mcp-bearer"}, json=INIT)
        assert fine.status_code == 200


async def test_a_body_that_stops_coming_is_408() -> None:
    app = McpAsgiApp(EchoHandler(), AsgiOptions(body_timeout=0.2))
    async with served(app) as s, await trio.open_tcp_stream("127.0.0.1", s.port) as sock:
        await sock.send_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                            b"Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{")
        got = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in got:
                got += await sock.receive_some(65536)
        assert got.startswith(b"HTTP/1.1 408 ")
