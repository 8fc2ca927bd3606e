"""Hostile connections against a real ``agentd --serve-mcp`` process: each is refused or closed on its own, and
the daemon keeps serving a well-behaved client (and exits 0 on SIGTERM, checked by ``worker``).

Raw HTTP/2 frames come from the ``h2`` library (client side), raw HTTP/1.1 from plain sockets.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import pytest
import trio

from tests.selfmcp.harness import LegacyPeer
from tests.selfmcp.test_composition import worker
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

BASE = ["--intelligence", "test"]


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


async def _served(url: str) -> None:
    """A fresh, well-behaved client gets a session and a tool answer."""
    with trio.fail_after(15):
        async with httpx.AsyncClient(timeout=10) as client:
            peer = LegacyPeer(client, url)
            await peer.initialize()
            result = await peer.call("tools/call", {"name": "status", "arguments": {}})
            assert "run_id" in result["result"]["structuredContent"]


async def _serves(url: str, *passing: type[BaseException]) -> bool:
    """``_served``, False on one of the ``passing`` failures (the server is not back yet)."""
    try:
        await _served(url)
    except passing:
        return False
    return True


def _clean(log: list[str]) -> None:
    """stderr carries JSON events only: no traceback, no stray text."""
    for line in log:
        json.loads(line)
    assert not any("Traceback" in line for line in log)


async def _until_closed(sock: trio.SocketStream, seconds: float) -> bytes:
    """Read until the server closes (or resets) the connection; fail if it does not within ``seconds``."""
    got = b""
    with trio.fail_after(seconds):
        while True:
            try:
                chunk = await sock.receive_some(65536)
            except trio.BrokenResourceError:
                return got
            if not chunk:
                return got
            got += chunk


def _h2_client() -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    return conn


async def _send(sock: trio.SocketStream, data: bytes) -> bool:
    """Send; False when the server already closed the connection."""
    try:
        await sock.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True


@asynccontextmanager
async def _daemon(*extra: str, log: list[str]) -> AsyncIterator[str]:
    async with worker(["--serve-mcp", "http://127.0.0.1:0/mcp", *extra, *BASE], stderr_lines=log) as url:
        yield url  # serve.start advertises the endpoint with its path


# -- HTTP/2 is off unless asked for ----------------------------------------------------------------------------


async def test_default_daemon_refuses_h2c_and_survives_a_priority_flood_and_websocket_upgrades() -> None:
    """Before: 1,001 PRIORITY frames on an h2c connection, or a WebSocket upgrade with one trailing byte, ended the
    process before any authentication."""
    log: list[str] = []
    async with _daemon(log=log) as url:
        port = _port(url)
        # the PRIORITY flood: 14 KB, no request
        conn = _h2_client()
        for i in range(1001):
            conn.prioritize(2 * i + 1, weight=16)
        sock = await trio.open_tcp_stream("127.0.0.1", port)
        async with sock:
            await _send(sock, conn.data_to_send())
            reply = await _until_closed(sock, 10)
        assert reply.startswith(b"HTTP/1.1 505")  # no HTTP/2 here: the preface is refused in HTTP/1.1
        await _served(url)

        # an h2c Upgrade is ignored: the request is answered in HTTP/1.1
        sock = await trio.open_tcp_stream("127.0.0.1", port)
        async with sock:
            await sock.send_all(b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                                b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n")
            with trio.fail_after(10):
                head = await sock.receive_some(65536)
        assert head.startswith(b"HTTP/1.1 404")

        # WebSocket upgrades, with and without a trailing byte, to the endpoint and elsewhere: a clean 4xx
        upgrade = (b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                   b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        for path, status in ((b"/mcp", b"406"), (b"/elsewhere", b"404")):
            for trailing in (b"", b"x"):
                sock = await trio.open_tcp_stream("127.0.0.1", port)
                async with sock:
                    await sock.send_all(upgrade % path + trailing)
                    with trio.fail_after(10):
                        head = await sock.receive_some(65536)
                assert head.startswith(b"HTTP/1.1 " + status), (path, trailing, head[:80])
                await _served(url)
    _clean(log)


# -- HTTP/2 when enabled: control frames are bounded per connection -------------------------------------------


async def test_http2_floods_close_only_the_flooding_connection() -> None:
    """Before: PRIORITY or open-and-reset floods ended the process (h2's priority tree); a PING flood was answered
    forever. Now each flooding connection is closed (GOAWAY) and the daemon keeps serving."""
    log: list[str] = []
    async with _daemon("--serve-http2", log=log) as url:
        port = _port(url)

        async def flood(frames: Any) -> bytes:
            conn = _h2_client()
            sock = await trio.open_tcp_stream("127.0.0.1", port)
            async with sock:
                await _send(sock, conn.data_to_send())
                for _ in range(200):
                    frames(conn)
                    if not await _send(sock, conn.data_to_send()):
                        break
                return await _until_closed(sock, 10)

        def priorities(conn: h2.connection.H2Connection) -> None:
            base = conn.highest_outbound_stream_id or 0
            for i in range(50):
                conn.prioritize(base + 2 * i + 1, weight=16)
            conn.highest_outbound_stream_id = base + 100

        def resets(conn: h2.connection.H2Connection) -> None:
            for _ in range(100):
                sid = conn.get_next_available_stream_id()
                conn.send_headers(sid, [(":method", "GET"), (":path", "/mcp"), (":scheme", "http"),
                                        (":authority", "127.0.0.1")])
                conn.reset_stream(sid)

        def pings(conn: h2.connection.H2Connection) -> None:
            for _ in range(50):
                conn.ping(b"12345678")

        def settings(conn: h2.connection.H2Connection) -> None:
            for _ in range(50):
                conn.update_settings({h2.settings.SettingCodes.ENABLE_PUSH: 0})

        for frames in (priorities, resets, pings, settings):
            reply = await flood(frames)
            # the server's last word is a GOAWAY (frame type 7), not silence
            assert b"\x07\x00\x00\x00\x00\x00" in reply, frames.__name__
            await _served(url)
    _clean(log)


async def test_a_late_request_body_after_the_answer_leaves_the_connection_usable() -> None:
    """DATA that arrives (legally) after the server answered and ended the stream: hypercorn's h2 protocol raised
    ``KeyError`` there (contained by the connection guard, then the connection closed). agentd's own HTTP/2 drops
    the late body (its flow-control window returned) and the same connection serves the next stream."""
    log: list[str] = []
    async with _daemon("--serve-http2", log=log) as url:
        conn = _h2_client()
        sock = await trio.open_tcp_stream("127.0.0.1", _port(url))
        async with sock:
            for stream_id in (1, 3, 5):
                conn.send_headers(stream_id, [(":method", "POST"), (":path", "/nope"), (":scheme", "http"),
                                              (":authority", "127.0.0.1")])
                await sock.send_all(conn.data_to_send())
                ended = False
                with trio.fail_after(10):
                    while not ended:
                        data = await sock.receive_some(65536)
                        assert data
                        events = conn.receive_data(data)
                        ended = any(isinstance(e, h2.events.StreamEnded) for e in events)
                        assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in events)
                        await _send(sock, conn.data_to_send())
                conn.send_data(stream_id, b"late body", end_stream=True)
                await sock.send_all(conn.data_to_send())
        await _served(url)
    _clean(log)
    assert not any('"serve.connection_error"' in line for line in log)


async def test_an_idle_http2_connection_kept_alive_by_pings_is_closed() -> None:
    """Before: a prior-knowledge h2c connection with no stream was never idle-closed while it sent PINGs."""
    log: list[str] = []
    async with _daemon("--serve-http2", log=log) as url:
        conn = _h2_client()
        sock = await trio.open_tcp_stream("127.0.0.1", _port(url))
        async with sock:
            await sock.send_all(conn.data_to_send())
            closed = trio.Event()

            async def ping() -> None:
                while not closed.is_set():
                    conn.ping(b"keepaliv")
                    if not await _send(sock, conn.data_to_send()):
                        return
                    await trio.sleep(1)  # real time: a PING each second, well inside the daemon's 10 s idle limit

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ping)
                await _until_closed(sock, 25)  # the idle limit is 10 s
                closed.set()
        await _served(url)
    _clean(log)


# -- connection caps -------------------------------------------------------------------------------------------


async def test_connections_past_the_caps_are_closed_and_logged_without_tracebacks() -> None:
    log: list[str] = []
    async with _daemon("--serve-max-connections", "8", "--serve-max-per-client", "6", log=log) as url:
        port = _port(url)
        socks = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(30)]
        refused = 0

        async def closed_at_once(sock: trio.SocketStream) -> None:
            nonlocal refused
            with trio.move_on_after(3):  # well inside the 10 s idle limit that closes the admitted ones
                try:
                    if await sock.receive_some(1) == b"":
                        refused += 1
                except trio.BrokenResourceError:
                    refused += 1

        async with trio.open_nursery() as nursery:
            for sock in socks:
                nursery.start_soon(closed_at_once, sock)
        assert refused == 30 - 6  # the per-client cap (6) binds first on loopback
        # rate-limited: the burst of 24 refusals is not 24 lines, and a later line counts what was held back
        # (one more refused connection per 0.2 s, which the 5-a-second limit lets through, until one tells it)
        with trio.fail_after(10):
            while not any('"suppressed"' in line for line in log):
                async with await trio.open_tcp_stream("127.0.0.1", port) as extra:
                    with trio.move_on_after(3):
                        try:
                            assert await extra.receive_some(1) == b""
                        except trio.BrokenResourceError:
                            pass
                await trio.sleep(0.2)  # real time: one refusal per 0.2 s, which the 5-a-second log limit lets through
        for sock in socks:
            await sock.aclose()
        await until(lambda: _serves(url, httpx.HTTPError, AssertionError), timeout=10,
                    what="served again once the server noticed the closes")
    refusals = [json.loads(line) for line in log if '"serve.refused"' in line]
    assert any(r.get("reason") == "client_connection_limit" for r in refusals)
    assert len(refusals) < 24 and any(r.get("suppressed") for r in refusals)
    _clean(log)


async def test_accept_errors_under_a_small_descriptor_limit_do_not_end_the_server(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: EMFILE on accept printed tracebacks (trio's accept loop logs with exc_info) to stderr."""
    log: list[str] = []
    # a wrapper that lowers RLIMIT_NOFILE, then runs agentd as ``python -m agentd`` would
    launcher = tmp_path / "lowfd.py"
    launcher.write_text("import resource, runpy, sys\n"
                        "resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96))\n"
                        "sys.argv = ['agentd', *sys.argv[1:]]\n"
                        "runpy.run_module('agentd', run_name='__main__', alter_sys=True)\n")
    from tests.selfmcp import test_composition

    monkeypatch.setattr(test_composition, "AGENTD", [sys.executable, str(launcher)])
    async with worker(["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-max-per-client", "1000", *BASE],
                      env={"PYTHONPATH": os.getcwd()}, stderr_lines=log) as bound:
        url = bound
        port = _port(url)
        socks = []
        for _ in range(150):
            socks.append(await trio.open_tcp_stream("127.0.0.1", port))
        await until(lambda: any('"reason": "accept"' in line for line in log), timeout=20,
                    what="an accept error under the descriptor limit")
        for sock in socks:
            await sock.aclose()
        await until(lambda: _serves(url, httpx.HTTPError, AssertionError, trio.TooSlowError), timeout=20,
                    what="served again once descriptors were free")
    _clean(log)
    assert any('"reason": "accept"' in line for line in log)


# -- in process: TLS offers HTTP/2 only when enabled; error replies do not echo a large value ------------------


async def test_tls_offers_only_http11_by_default(tmp_path: Any) -> None:
    """Before: agentd's own TLS context advertised ``h2``, so HTTP/2's frame handling was reachable over TLS."""
    from tests.selfmcp.certs import make_pki
    from tests.selfmcp.harness import serving

    pki = make_pki(tmp_path)
    async with serving(pki=pki) as s:
        context = pki.client_context(None)
        context.set_alpn_protocols(["h2", "http/1.1"])
        tcp = await trio.open_tcp_stream("127.0.0.1", s.serving.port)
        stream = trio.SSLStream(tcp, context, server_hostname="localhost")
        async with stream:
            with trio.fail_after(10):
                await stream.do_handshake()
            assert stream.selected_alpn_protocol() == "http/1.1"


async def test_an_unknown_huge_method_is_not_echoed_back() -> None:
    """Before: a 5.5 MB request produced an 11 MB error reply (the method name, escaped)."""
    from tests.selfmcp.harness import serving

    async with serving() as s, httpx.AsyncClient(timeout=30) as client:
        peer = LegacyPeer(client, s.url)
        await peer.initialize()
        r = await peer.post("x" * 2_000_000)
        assert r.json()["error"]["code"] == -32601
        assert len(r.content) < 4096
