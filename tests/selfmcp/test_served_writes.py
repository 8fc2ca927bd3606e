"""The served path's per-request cost in agentd's HTTP/1.1 runner (agentd.transport.http11).

A sized HTTP/1.1 response leaves in one write (head and body together, no empty write for its end), while a
streamed one (SSE, no ``Content-Length``) still sends its head at once; a keep-alive request starts one task
(the app's), not also a fresh idle timer; and the idle limit still closes an idle connection.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from agentd.transport.http11 import Http11
from agentd.transport.serve import ServeConfig, serve_mcp, settings
from agentd.transport.served import Served
from tests.waiting import until

REQUEST = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"


async def _sized(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


class _Recorded(trio.abc.Stream):
    """The server's end of a real socket pair, each ``send_all`` recorded."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _read_until(stream: trio.SocketStream, end: bytes) -> bytes:
    got = b""
    with trio.fail_after(10):
        while end not in got:
            chunk = await stream.receive_some(65536)
            assert chunk, got
            got += chunk
    return got


async def _writes(app: Any, *, until: trio.Event | None = None, end: bytes = b"}") -> list[bytes]:
    """The bytes the HTTP/1.1 runner hands the socket for one request, one entry per write."""
    errors: list[BaseException] = []
    ours, theirs = trio.socket.socketpair()
    server = _Recorded(trio.SocketStream(ours))
    async with trio.SocketStream(theirs) as client, trio.open_nursery() as nursery:
        served = Served(settings(ServeConfig("http://127.0.0.1:1/mcp")), trio.current_time())
        connection = Http11(server, app, served, scheme="http", client=None, server=None, on_app_error=errors.append)
        nursery.start_soon(connection.run)
        await client.send_all(REQUEST)
        await _read_until(client, b"\r\n\r\n" if until is not None else end)
        if until is not None:
            until.set()
            await _read_until(client, end)
        connection.close()
    await server.aclose()
    assert not errors
    return server.writes


async def test_a_sized_response_leaves_in_one_write() -> None:
    writes = await _writes(_sized)
    assert len(writes) == 1, writes
    assert writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b"\r\n\r\n{}")


async def test_a_streamed_response_sends_its_head_before_its_first_event() -> None:
    go = trio.Event()
    heads: list[int] = []

    async def sse(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        heads.append(1)
        await go.wait()
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": False})

    writes = await _writes(sse, until=go, end=b"data: x")
    assert heads and writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b"\r\n\r\n")
    assert b"data: x" in b"".join(writes[1:])


async def test_an_app_that_ends_without_a_body_still_sends_the_head() -> None:
    async def headless(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})

    writes = await _writes(headless, end=b"\r\n\r\n")
    assert writes and writes[0].startswith(b"HTTP/1.1 200 ")


class _Spawns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


class _App:
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await _sized(scope, receive, send)

    def drain(self) -> None:
        pass


async def _request(stream: trio.SocketStream) -> None:
    await stream.send_all(REQUEST)
    got = b""
    while not got.endswith(b"{}"):
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise trio.BrokenResourceError("closed by the server")
        got += chunk


async def test_keep_alive_requests_start_no_idle_timer_task_and_idle_connections_still_close() -> None:
    cfg = ServeConfig("http://127.0.0.1:0/mcp", header_timeout=0.5)
    async with trio.open_nursery() as nursery:
        serving = await nursery.start(lambda task_status: serve_mcp(_App(), cfg, shutdown_trigger=trio.sleep_forever,
                                                                   task_status=task_status))
        async with await trio.open_tcp_stream("127.0.0.1", serving.port) as stream:
            await _request(stream)
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            for _ in range(20):
                await _request(stream)
            trio.lowlevel.remove_instrument(spawns)
            assert spawns.count == 20  # one task per request, the app's; no idle timer restarts
            with trio.fail_after(5):  # idle past the 0.5 s limit: the server closes the connection
                assert await stream.receive_some(65536) == b""
        nursery.cancel_scope.cancel()


async def test_a_peer_gone_mid_request_frees_its_connection_slot() -> None:
    """The idle-limit task must not outlive a connection that closed while busy (its slot would leak)."""
    answered, running = trio.Event(), trio.Event()

    class Waits(_App):
        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            if scope["path"] == "/slow":
                running.set()
                while (await receive())["type"] != "http.disconnect":
                    pass
                return
            await _sized(scope, receive, send)
            answered.set()

    cfg = ServeConfig("http://127.0.0.1:0/mcp", header_timeout=30, max_connections=1)
    async with trio.open_nursery() as nursery:
        serving = await nursery.start(lambda task_status: serve_mcp(Waits(), cfg, shutdown_trigger=trio.sleep_forever,
                                                                   task_status=task_status))
        first = await trio.open_tcp_stream("127.0.0.1", serving.port)
        await first.send_all(REQUEST.replace(b"/mcp", b"/slow"))
        with trio.fail_after(10):
            await running.wait()
        await first.aclose()  # gone while its request runs

        async def admitted() -> bool:
            second = await trio.open_tcp_stream("127.0.0.1", serving.port)
            try:
                await _request(second)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return False  # still refused: the first connection's slot is not free yet
            finally:
                await second.aclose()
            return answered.is_set()

        await until(admitted, timeout=10, what="the freed slot")  # well inside the 30 s idle limit
        nursery.cancel_scope.cancel()
