"""The served endpoint's Host and Origin checks parse strictly, against a real ``agentd --serve-mcp --serve-a2a``.

Before: an Origin of ``http://evil.com\\@localhost`` was accepted (``urlsplit`` reads its host as ``localhost``,
a browser as ``evil.com``), and a Host of ``127.0.0.1:1@evil.example`` passed the loopback check (its host read
as ``127.0.0.1``) and was copied into the Agent Card, whose RPC URL then pointed at ``evil.example``. Now a Host
is ``host[:port]`` and an Origin ``http(s)://host[:port]`` exactly, anything else is 403, and the card names the
Host as parsed. A well-behaved client is served alongside, within 2 s.
"""

from __future__ import annotations

import json

import pytest
import trio

from agentd.transport.gate import Authority, parse_authority, parse_origin
from tests.selfmcp.test_composition import worker
from tests.selfmcp.test_hostile_connections import _port, _served

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

CARD = "/.well-known/agent-card.json"
INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()


async def _exchange(port: int, head: bytes) -> tuple[int, bytes]:
    """One raw HTTP/1.1 request (``head`` without the final blank line); the status and the body."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as sock:
        await sock.send_all(head + b"Connection: close\r\n\r\n")
        got = b""
        with trio.fail_after(10):
            while chunk := await sock.receive_some(65536):
                got += chunk
    status = int(got.split(b" ", 2)[1])
    return status, got.split(b"\r\n\r\n", 1)[1]


def _get(path: str, host: bytes, *extra: bytes) -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: " + host + b"\r\n" + b"".join(e + b"\r\n" for e in extra)


@pytest.mark.parametrize("host", [b"127.0.0.1:1@evil.example", b"evil.example@127.0.0.1", b"127.0.0.1/x",
                                  b"127.0.0.1\\@evil.example", b"127.0.0.1:99999", b"localhost:", b"[::1"])
def test_a_host_header_is_host_and_port_or_nothing(host):
    assert parse_authority(host.decode()) is None


def test_well_formed_hosts_and_origins_parse_to_their_host():
    assert parse_authority("LocalHost.:8080") == Authority("localhost", 8080)
    assert parse_authority("[::1]:9") == Authority("::1", 9) and str(Authority("::1", 9)) == "[::1]:9"
    assert parse_origin("http://localhost:8080") == Authority("localhost", 8080)
    for origin in ("http://evil.com\\@localhost", "http://localhost:1@evil.example", "http://a@localhost", "null",
                   "file://localhost", "http://localhost/path", "http://localhost\t"):
        assert parse_origin(origin) is None, origin


async def test_hostile_host_and_origin_are_refused_and_the_card_names_only_the_parsed_host() -> None:
    log: list[str] = []
    argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-a2a", "--intelligence", "test"]
    async with worker(argv, stderr_lines=log) as url:
        port = _port(url)
        own = b"127.0.0.1:%d" % port
        post = b"POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (
            own, len(INIT))
        for origin in (b"http://evil.com\\@localhost", b"http://localhost:1@evil.example", b"http://a@127.0.0.1",
                       b"null"):
            async with await trio.open_tcp_stream("127.0.0.1", port) as sock:
                await sock.send_all(post + b"Origin: " + origin + b"\r\nConnection: close\r\n\r\n" + INIT)
                got = b""
                with trio.fail_after(10):
                    while chunk := await sock.receive_some(65536):
                        got += chunk
            assert got.startswith(b"HTTP/1.1 403 ") and b"Origin not allowed" in got, (origin, got[:300])
            with trio.fail_after(2):
                await _served(url)
        for host in (b"127.0.0.1:1@evil.example", b"localhost:%d@evil.example" % port, b"evil.example"):
            for path in ("/mcp", CARD):
                status, body = await _exchange(port, _get(path, host))
                assert status == 403 and b"evil" not in body, (host, path, status, body[:300])
            with trio.fail_after(2):
                await _served(url)
        # well-formed: the card's URL is the Host as parsed (lower case, no trailing dot), and a same-host
        # Origin is accepted
        status, body = await _exchange(port, _get(CARD, b"LOCALHOST.:%d" % port, b"Origin: http://localhost:%d" % port))
        assert status == 200, body[:300]
        card = json.loads(body)
        assert [i["url"] for i in card["supportedInterfaces"]] == [f"http://localhost:{port}/a2a"]
    refusals = {json.loads(line)["reason"] for line in log if '"serve.refused"' in line}
    assert {"host", "origin"} <= refusals
