"""agentd's own HTTP server (agentd.transport.connections, http11, websocket) on real sockets, in process.

The end-to-end bounds (caps, eviction, slowloris, HTTP/2 floods) are tested against a real daemon in
tests/selfmcp/test_hostile_connections.py and tests/security/; here: what one connection sees of HTTP/1.1
(pipelining, ``Expect: 100-continue``, HEAD, an oversized or malformed head, a failing app), the WebSocket
handshake only where configured, and that a connection whose runner fails is contained.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import wsproto
import wsproto.events

from agentd.telemetry.events import EventLog
from agentd.transport.connections import ConnectionLimits, Connections
from agentd.transport.serve import ServeConfig, Serving, serve_mcp, settings

SIZED = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"


class _App:
    """Echoes the body; ``/boom`` raises before answering; ``/ws`` accepts a WebSocket and echoes text."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            assert (await receive())["type"] == "websocket.connect"
            await send({"type": "websocket.accept"})
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    return
                await send({"type": "websocket.send", "text": "echo:" + message["text"]})
        if scope["path"] == "/boom":
            raise RuntimeError("secret from the peer's bytes")
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def drain(self) -> None:
        pass


@asynccontextmanager
async def _serving(log: list[dict[str, Any]], url: str = "http://127.0.0.1:0/mcp",
                   **options: Any) -> AsyncIterator[Serving]:
    cfg = ServeConfig(url, websocket_paths=frozenset({"/ws"}), **options)
    async with trio.open_nursery() as nursery:
        serving: Serving = await nursery.start(lambda task_status: serve_mcp(
            _App(), cfg, shutdown_trigger=trio.sleep_forever, log=EventLog(sink=log.append), task_status=task_status))
        yield serving
        nursery.cancel_scope.cancel()


async def _exchange(port: int, data: bytes, until: bytes) -> bytes:
    async with await trio.open_tcp_stream("127.0.0.1", port) as sock:
        await sock.send_all(data)
        got = b""
        with trio.fail_after(10):
            while until not in got:
                chunk = await sock.receive_some(65536)
                if not chunk:
                    break
                got += chunk
        return got


async def test_pipelined_requests_are_answered_in_order() -> None:
    log: list[dict[str, Any]] = []
    async with _serving(log) as s:
        got = await _exchange(s.port, SIZED % (3, b"one") + SIZED % (3, b"two") + SIZED % (5, b"three"), b"three")
    assert got.count(b"HTTP/1.1 200 ") == 3
    assert got.index(b"one") < got.index(b"two") < got.index(b"three")


async def test_expect_continue_head_and_bad_heads() -> None:
    log: list[dict[str, Any]] = []
    async with _serving(log) as s:
        async with await trio.open_tcp_stream("127.0.0.1", s.port) as sock:
            await sock.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
            with trio.fail_after(10):
                assert (await sock.receive_some(65536)).startswith(b"HTTP/1.1 100 ")
            await sock.send_all(b"body")
            with trio.fail_after(10):
                got = b""
                while not got.endswith(b"body"):
                    got += await sock.receive_some(65536)
            assert got.startswith(b"HTTP/1.1 200 ")
        head = await _exchange(s.port, b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n", b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")
        huge = await _exchange(s.port, b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
                               b"\r\n\r\n")
        assert huge.startswith(b"HTTP/1.1 431 ")
        bad = await _exchange(s.port, b"GET /echo HTTP/1.1\r\nno colon here\r\n\r\n", b"\r\n\r\n")
        assert bad.startswith(b"HTTP/1.1 400 ")


async def test_a_failing_app_gets_a_500_and_the_class_name_only_is_logged() -> None:
    log: list[dict[str, Any]] = []
    async with _serving(log) as s:
        got = await _exchange(s.port, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n", b"\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 500 ")
        assert (await _exchange(s.port, SIZED % (2, b"ok"), b"ok")).endswith(b"ok")
    events = [line for line in log if line["event"] == "serve.request"]
    assert events and events[0]["error"] == "RuntimeError"
    assert "secret" not in json.dumps(log)


@pytest.mark.parametrize(("path", "switched"), [("/ws", True), ("/echo", False)])
async def test_a_websocket_only_on_its_configured_path(path: str, switched: bool) -> None:
    log: list[dict[str, Any]] = []
    async with _serving(log) as s, await trio.open_tcp_stream("127.0.0.1", s.port) as sock:
        client = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        await sock.send_all(client.send(wsproto.events.Request(host="x", target=path)))
        got: list[Any] = []
        with trio.fail_after(10):
            while not got:
                data = await sock.receive_some(65536)
                assert data
                client.receive_data(data)
                got = list(client.events())
        if not switched:
            assert isinstance(got[0], wsproto.events.RejectConnection) and got[0].status_code == 200
            return
        assert isinstance(got[0], wsproto.events.AcceptConnection)
        await sock.send_all(client.send(wsproto.events.Ping(payload=b"p")) +
                            client.send(wsproto.events.TextMessage(data="hi")))
        seen: list[Any] = []
        with trio.fail_after(10):
            while not any(isinstance(e, wsproto.events.TextMessage) for e in seen):
                client.receive_data(await sock.receive_some(65536))
                seen += list(client.events())
        assert any(isinstance(e, wsproto.events.Pong) for e in seen)
        assert [e.data for e in seen if isinstance(e, wsproto.events.TextMessage)] == ["echo:hi"]
        await sock.send_all(client.send(wsproto.events.CloseConnection(code=1000)))
        with trio.fail_after(10):
            while True:
                data = await sock.receive_some(65536)
                if not data:
                    break
                client.receive_data(data)
                seen += list(client.events())
        assert any(isinstance(e, wsproto.events.CloseConnection) for e in seen)


class _Failing(trio.abc.Stream):
    """A real socket whose reads fail with an error no part of the server expects (a bug, say)."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self.inner = inner
        self.socket = inner.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        await self.inner.receive_some(max_bytes)
        raise ZeroDivisionError("secret from the peer's bytes")

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_failing_connection_is_contained_logged_and_closed() -> None:
    log: list[dict[str, Any]] = []
    connections = Connections(_App(), settings(ServeConfig("http://127.0.0.1:0/mcp")), ConnectionLimits(8, 8),
                              EventLog(sink=log.append))
    ours, theirs = trio.socket.socketpair()
    async with trio.SocketStream(theirs) as peer, trio.open_nursery() as nursery:
        nursery.start_soon(connections.handle, _Failing(trio.SocketStream(ours)))
        await peer.send_all(b"GET / HTTP/1.1\r\n")
        with trio.fail_after(10):
            assert await peer.receive_some(65536) == b""  # closed
    assert connections.open == 0 and connections.per_client == {}
    events = [line for line in log if line["event"] == "serve.connection_error"]
    assert events and events[0]["error"] == "ZeroDivisionError" and events[0]["level"] == "warn"
    assert "secret" not in json.dumps(log)


@pytest.mark.parametrize("tls", [True, False], ids=["alpn-h2", "h2c-prior-knowledge"])
async def test_http2_when_enabled_serves_requests_with_bodies(tmp_path: Any, tls: bool) -> None:
    from tests.selfmcp.certs import make_pki

    log: list[dict[str, Any]] = []
    pki = make_pki(tmp_path)
    options: dict[str, Any] = {"http2": True}
    if tls:
        options |= {"url": "https://127.0.0.1:0/mcp", "cert": pki.server.cert, "key": pki.server.key}
    async with _serving(log, **options) as s:
        url = s.urls[0].replace("127.0.0.1", "localhost") + "/echo"
        async with httpx.AsyncClient(http1=False, http2=True, timeout=10,
                                     verify=pki.client_context() if tls else True) as client:
            async with trio.open_nursery() as nursery:
                answers: list[httpx.Response] = []

                async def post(i: int) -> None:
                    answers.append(await client.post(url, content=b"x" * (i * 70_000)))

                for i in range(4):  # concurrent streams on one connection, bodies past the initial window
                    nursery.start_soon(post, i)
        assert sorted(len(r.content) for r in answers) == [i * 70_000 for i in range(4)]
        assert {r.http_version for r in answers} == {"HTTP/2"}
    assert not [line for line in log if line["event"] in ("serve.connection_error", "serve.request")]


async def test_one_deadline_is_the_idle_limit_eviction_and_shutdown(autojump_clock: Any) -> None:
    """``Served.reads``: idle limit while idle, none while busy; an eviction loses to a request that came in
    meanwhile; shutdown closes an idle connection at once and a busy one when it rests."""
    from agentd.transport.served import Served, Settings

    settings = Settings(idle_timeout=10.0)

    async def reads_until_cancelled(served: Served) -> float:
        start = trio.current_time()
        with served.enter():
            await trio.sleep_forever()
        return trio.current_time() - start

    idle = Served(settings, trio.current_time())
    assert await reads_until_cancelled(idle) == pytest.approx(10.0)  # nothing came in: the idle limit

    chosen = Served(settings, trio.current_time())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reads_until_cancelled, chosen)
        await trio.sleep(3)
        chosen.evict()  # idle and chosen to make room: closed now, not at the idle limit
        await trio.sleep(0.5)
        assert chosen.reads.cancelled_caught and chosen.evicted

    served = Served(settings, trio.current_time())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reads_until_cancelled, served)
        await trio.sleep(5)
        served.busy()  # a request head came in: no limit while it runs
        await trio.sleep(60)
        served.evict()
        served.busy()  # ... and one more came in before the eviction took effect: it stays, and counts again
        assert not served.evicted
        await trio.sleep(60)
        assert not nursery.cancel_scope.cancelled_caught and not served.reads.cancelled_caught
        served.close_when_idle()  # shutdown while busy: open until the response is out
        await trio.sleep(60)
        assert not served.reads.cancelled_caught
        served.rest()  # answered: closes at once
    assert served.reads.cancelled_caught and served.idle
