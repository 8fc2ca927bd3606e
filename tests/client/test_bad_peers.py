"""Misbehaving peers: every one must end in a clear typed error, never a hang or a crash.

The peers are scripted in-process (tests/client/fakeserver.py) on real loopback sockets.
"""

from __future__ import annotations

import json

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.errors import McpConnectError, McpProtocolError, McpRpcError, McpTransportError
from agentd.mcp.sse import encode_event
from tests.client.fakeserver import Req, Resp, error, mcp_answer, result, serve_fake
from tests.client.helpers import Events, server


def only(method: str, handler):  # type: ignore[no-untyped-def]
    """Script ``method``; everything else gets the well-behaved default."""

    async def dispatch(req: Req, resp: Resp) -> None:
        if req.rpc_method == method:
            await handler(req, resp)
        else:
            await mcp_answer(req, resp)

    return dispatch


async def connect_error(handler, **options) -> McpConnectError:  # type: ignore[no-untyped-def]
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        with trio.fail_after(20), pytest.raises(McpConnectError) as info:
            async with open_mcp_pool([server(fake.url, **options)], log=events.log):
                pass
        nursery.cancel_scope.cancel()
    return info.value


async def test_garbage_initialize_body_is_a_connect_error() -> None:
    async def garbage(req: Req, resp: Resp) -> None:
        await resp.body(200, b"<html>hello</html>")

    exc = await connect_error(only("initialize", garbage))
    assert "not a JSON-RPC message" in str(exc)
    assert exc.server == "s"


async def test_wrong_content_type_is_a_connect_error() -> None:
    async def html(req: Req, resp: Resp) -> None:
        await resp.body(200, json.dumps(result(req, {})).encode(), content_type="text/html")

    exc = await connect_error(only("initialize", html))
    assert "unexpected content type 'text/html'" in str(exc)


async def test_unknown_protocol_version_is_a_connect_error() -> None:
    async def odd(req: Req, resp: Resp) -> None:
        await resp.json(result(req, {"protocolVersion": "1999-01-01", "capabilities": {},
                                     "serverInfo": {"name": "x", "version": "1"}}))

    exc = await connect_error(only("initialize", odd))
    assert "1999-01-01" in str(exc)


async def test_initialize_refused_by_a_legacy_error_is_a_connect_error() -> None:
    async def refuse(req: Req, resp: Resp) -> None:
        await resp.json(error(req, -32603, "boom"), status=500)

    exc = await connect_error(only("initialize", refuse))
    assert "initialize was refused" in str(exc) and "-32603" in str(exc)


async def test_redirect_is_never_followed() -> None:
    async def redirect(req: Req, resp: Resp) -> None:
        await resp.body(307, b"", headers={"location": "/elsewhere?token=secret"})

    exc = await connect_error(redirect)
    assert "redirect to http://127.0.0.1:" in str(exc) and "/elsewhere" in str(exc)
    assert "secret" not in str(exc)


async def test_connection_refused_is_a_connect_error() -> None:
    from tests.peers.launch import free_port

    events = Events()
    with trio.fail_after(20), pytest.raises(McpConnectError) as info:
        async with open_mcp_pool([server(f"http://127.0.0.1:{free_port()}/mcp")], log=events.log):
            pass
    assert "ConnectError" in str(info.value)


async def test_slow_handshake_times_out_at_the_init_timeout(autojump_clock: trio.abc.Clock) -> None:
    async def stall(req: Req, resp: Resp) -> None:
        await trio.sleep_forever()

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("initialize", stall))
        with pytest.raises(McpConnectError) as info:
            async with open_mcp_pool([server(fake.url, connect_timeout=10.0)], log=Events().log):
                pass
        nursery.cancel_scope.cancel()
    assert "within 10 s" in str(info.value)
    assert trio.current_time() - start == pytest.approx(10.0, abs=0.5)
    # initialize is never cancelled with notifications/cancelled.
    assert "notifications/cancelled" not in fake.methods()


async def test_truncated_sse_is_a_protocol_error() -> None:
    async def truncated(req: Req, resp: Resp) -> None:
        await resp.start(200, {"content-type": "text/event-stream"})
        await resp.write(b'data: {"jsonrpc":"2.0","id":')
        await resp.end()

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("tools/call", truncated))
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            with trio.fail_after(10), pytest.raises(McpProtocolError, match="middle of an event"):
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()


async def test_sse_stream_that_ends_without_answer_is_a_transport_error() -> None:
    async def empty(req: Req, resp: Resp) -> None:
        await resp.start(200, {"content-type": "text/event-stream"})
        await resp.write(b": keepalive\n\n")
        await resp.end()

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("tools/call", empty))
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            with trio.fail_after(10), pytest.raises(McpTransportError, match="without an answer"):
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()


async def test_garbage_tool_result_is_a_protocol_error() -> None:
    async def bad_shape(req: Req, resp: Resp) -> None:
        await resp.json(result(req, {"content": "not a list", "isError": "yes"}))

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("tools/call", bad_shape))
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            with trio.fail_after(10), pytest.raises(McpProtocolError, match="CallToolResult"):
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()


async def test_same_cursor_forever_stops_at_1024_pages() -> None:
    async def endless(req: Req, resp: Resp) -> None:
        await resp.json(result(req, {"tools": [], "nextCursor": "again"}))

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("tools/list", endless))
        with trio.fail_after(60), pytest.raises(McpConnectError, match="1024 pages"):
            async with open_mcp_pool([server(fake.url, connect_timeout=60.0)], log=Events().log):
                pass
        nursery.cancel_scope.cancel()
    assert fake.methods().count("tools/list") == 1024


async def test_oversized_json_response_is_refused() -> None:
    async def huge(req: Req, resp: Resp) -> None:
        text = "x" * (2 * 1024 * 1024)
        await resp.json(result(req, {"content": [{"type": "text", "text": text}]}))

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("tools/call", huge))
        async with open_mcp_pool([server(fake.url)], log=Events().log, max_body=1024 * 1024) as pool:
            with trio.fail_after(10), pytest.raises(McpProtocolError, match="exceeds the 1048576-byte limit"):
                await pool.call_tool("s", "t", {})
            # The connection survives a refused body, and nothing is left pending.
            assert (await pool.read_resource("r://x")).contents[0]["text"] == "x"
            assert pool.connections["s"].session.pending == {}
        nursery.cancel_scope.cancel()


async def test_oversized_sse_event_is_refused() -> None:
    async def huge(req: Req, resp: Resp) -> None:
        await resp.start(200, {"content-type": "text/event-stream"})
        chunk = b"data: " + b"y" * 65536 + b"\n"
        for _ in range(40):
            await resp.write(chunk)
        await resp.end()

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("tools/call", huge))
        async with open_mcp_pool([server(fake.url)], log=Events().log, max_body=1024 * 1024) as pool:
            with trio.fail_after(10), pytest.raises(McpProtocolError, match="exceeds"):
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()


async def test_http_error_without_jsonrpc_body_is_a_transport_error() -> None:
    async def oops(req: Req, resp: Resp) -> None:
        await resp.body(500, b"Internal Server Error", content_type="text/plain")

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("tools/call", oops))
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            with trio.fail_after(10), pytest.raises(McpTransportError, match="HTTP 500"):
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()


async def test_jsonrpc_error_in_http_400_body_is_an_rpc_error() -> None:
    async def bad(req: Req, resp: Resp) -> None:
        await resp.json(error(req, -32602, "bad arguments", {"field": "x"}), status=400)

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("tools/call", bad))
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            with trio.fail_after(10), pytest.raises(McpRpcError) as info:
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()
    assert info.value.code == -32602 and info.value.data == {"field": "x"}


async def test_dropped_connection_mid_response_is_a_transport_error() -> None:
    async def drop(req: Req, resp: Resp) -> None:
        await resp.start(200, {"content-type": "text/event-stream"})
        await resp.write(b": hi\n\n")
        await resp.abort()

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("tools/call", drop))
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            with trio.fail_after(10), pytest.raises(McpTransportError):
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()


async def test_event_stream_with_garbage_event_is_a_protocol_error() -> None:
    async def garbage(req: Req, resp: Resp) -> None:
        await resp.start(200, {"content-type": "text/event-stream"})
        await resp.write(encode_event("{not json"))
        await resp.end()

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, only("tools/call", garbage))
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            with trio.fail_after(10), pytest.raises(McpProtocolError, match="not a JSON-RPC message"):
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()
