"""Idle connections cannot keep new clients out of a real ``agentd --serve-mcp``: at the total connection cap the
oldest idle connection is closed to admit the new one (whatever its source address), and a connection with a
request in flight is never cut.

Before: the per-client cap keyed on the exact source address, so idle keep-alive connections from a handful of
loopback addresses (127.0.0.2, 127.0.0.3, ...) filled every slot and a new client was refused.
"""

from __future__ import annotations

import json
import socket

import pytest
import trio

from tests.selfmcp.test_composition import worker
from tests.selfmcp.test_hostile_connections import _port, _served

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

CAP = 8


async def _from(source: str, port: int) -> trio.SocketStream:
    """A TCP connection to the daemon from the loopback address ``source``."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


def _request(port: int, body: bytes) -> bytes:
    return (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n" % (port, len(body)))


async def _response_head(sock: trio.SocketStream) -> bytes:
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = await sock.receive_some(65536)
        assert chunk, f"closed before a response: {got!r}"
        got += chunk
    return got


async def _until_closed(sock: trio.SocketStream) -> bool:
    """Wait for the server to close this connection (its unread bytes, a 404's body, are skipped)."""
    while True:
        try:
            if await sock.receive_some(65536) == b"":
                return True
        except trio.BrokenResourceError:
            return True


async def _scenario(url: str, port: int, body: bytes, opened: list[trio.SocketStream]) -> None:
    # the oldest connection has a request in flight: its head is in, its body is not
    slow = await _from("127.0.0.2", port)
    opened.append(slow)
    await slow.send_all(_request(port, body) + body[:5])
    # idle connections from three more addresses fill the cap: some sent nothing, some are keep-alive
    # connections between requests (one answered request each); the last is one of those, so once it is
    # answered every connection before it has been admitted
    idle: list[trio.SocketStream] = []
    for source, kept_alive in [("127.0.0.2", False), *((s, k) for s in ("127.0.0.3", "127.0.0.4", "127.0.0.5")
                                                        for k in (False, True))]:
        sock = await _from(source, port)
        opened.append(sock)
        if kept_alive:
            await _get_404(sock, port)
        elif not idle:  # the oldest idle one is trickling its headers (slowloris): not a request in flight yet
            await sock.send_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Slow: " % port)
        idle.append(sock)
    assert len(idle) + 1 == CAP
    # a new client from 127.0.0.1: its connection at the cap closes the oldest idle one (whose address also
    # has the request in flight), and it is served
    with trio.fail_after(2):
        await _served(url)
    with trio.fail_after(5):
        assert await _until_closed(idle[0])
    await _get_404(idle[1], port)  # the next oldest is still open and served
    for _ in range(2):  # and so are the next new clients
        with trio.fail_after(2):
            await _served(url)
    # the request in flight all along is answered: it was never cut
    await slow.send_all(body[5:])
    with trio.fail_after(10):
        head = await _response_head(slow)
    assert head.startswith(b"HTTP/1.1 "), head[:200]  # the app's answer (a ping without a session: 400)


async def _get_404(sock: trio.SocketStream, port: int) -> None:
    """One answered request (a 404 with a short body) on a connection that stays open."""
    await sock.send_all(b"GET /elsewhere HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
    with trio.fail_after(10):
        head = await _response_head(sock)
    assert head.startswith(b"HTTP/1.1 404 ") and b"connection: close" not in head.lower()


async def test_idle_connections_from_several_addresses_do_not_keep_a_new_client_out() -> None:
    log: list[str] = []
    argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", "test",
            "--serve-max-connections", str(CAP), "--serve-max-per-client", "2"]
    async with worker(argv, stderr_lines=log) as url:
        port = _port(url)
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
        opened: list[trio.SocketStream] = []
        try:
            await _scenario(url, port, body, opened)
        finally:
            for sock in opened:
                await sock.aclose()
    evictions = [json.loads(line) for line in log if '"serve.evicted"' in line]
    assert evictions and evictions[0]["reason"] == "connection_limit"
    assert not any('"connection_limit"' in line and '"serve.refused"' in line for line in log)


def test_the_per_client_cap_counts_an_ipv6_client_by_its_64() -> None:
    from agentd.transport.connections import client_key

    assert client_key("2001:db8:1:2::5") == client_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::5") != client_key("2001:db8:1:2::5")
    assert client_key("::ffff:192.0.2.7") == client_key("192.0.2.7") == "192.0.2.7"
    assert client_key("fe80::1%eth0") == "fe80::/64"
    assert client_key("") == ""
