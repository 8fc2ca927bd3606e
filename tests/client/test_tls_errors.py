"""Each common TLS failure to an MCP server gets its own plain error naming the server and what to do.

Real TLS servers on loopback with generated certificates: a CA agentd does not trust, a certificate for
another host, an expired certificate, a server that requires a client certificate (none sent, and one from
a CA it does not trust). The client-side cases are seen after the TLS 1.3 handshake, where httpx reports a
bare ReadError; agentd's one bounded probe tells them apart.
"""

from __future__ import annotations

import functools
import ssl
from pathlib import Path

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig, TlsConfig
from agentd.errors import McpConnectError
from agentd.transport import tls_errors
from tests.client.fakeserver import Req, Resp, mcp_answer, serve_fake
from tests.client.helpers import Events
from tests.selfmcp.certs import Issued, issue, make_ca


async def answer(req: Req, resp: Resp) -> None:
    await mcp_answer(req, resp)


def _server_context(leaf: Issued, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(leaf.cert), str(leaf.key))
    if client_ca is not None:
        context.load_verify_locations(str(client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def _connect_error(server_tls: ssl.SSLContext, tls: TlsConfig | None) -> tuple[str, int]:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            fake = await nursery.start(functools.partial(serve_fake, answer, tls=server_tls))
            with pytest.raises(McpConnectError) as caught:
                async with open_mcp_pool([McpServerConfig("files", fake.url, tls=tls)], log=Events().log):
                    pytest.fail("must not connect")
            nursery.cancel_scope.cancel()
    return str(caught.value), len(fake.requests)


async def test_every_tls_failure_has_its_own_plain_error(tmp_path: Path) -> None:
    ca, ca_cert, ca_key = make_ca(tmp_path, "ca")
    good = issue(tmp_path, "server", ca_cert, ca_key, server=True)
    expired = issue(tmp_path, "expired", ca_cert, ca_key, server=True, expired=True)
    elsewhere = issue(tmp_path, "elsewhere", ca_cert, ca_key, server=True, only=("elsewhere.example",))
    _, rogue_cert, rogue_key = make_ca(tmp_path, "rogue-ca")
    rogue = issue(tmp_path, "rogue-client", rogue_cert, rogue_key, server=False)
    trusted = TlsConfig(ca=str(ca))
    cases = {
        "unknown CA": (_server_context(good), None, tls_errors.UNTRUSTED_HINT),
        "wrong host": (_server_context(elsewhere), trusted, tls_errors.WRONG_HOST_HINT),
        "expired": (_server_context(expired), trusted, tls_errors.EXPIRED_HINT),
        "client certificate required": (_server_context(good, ca), trusted, tls_errors.CLIENT_CERT_REQUIRED_HINT),
        "client certificate refused": (_server_context(good, ca), TlsConfig(ca=str(ca), cert=str(rogue.cert),
                                                                             key=str(rogue.key)),
                                       tls_errors.CLIENT_CERT_REFUSED_HINT),
    }  # fmt: skip
    seen = set()
    for case, (server_tls, tls, hint) in cases.items():
        message, requests = await _connect_error(server_tls, tls)
        assert message.startswith("MCP server 'files' (https://127.0.0.1:"), (case, message)
        assert hint in message, (case, message)
        assert requests == 0, case  # nothing reached the application over a failed handshake
        seen.add(hint)
    assert len(seen) == len(cases)


async def test_the_probe_says_nothing_about_a_server_that_accepts_the_client(tmp_path: Path) -> None:
    ca, ca_cert, ca_key = make_ca(tmp_path, "ca")
    good = issue(tmp_path, "server", ca_cert, ca_key, server=True)
    client = issue(tmp_path, "client", ca_cert, ca_key, server=False)
    from agentd.transport.http_client import tls_context

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            fake = await nursery.start(functools.partial(serve_fake, answer, tls=_server_context(good, ca)))
            port = int(fake.url.rsplit(":", 1)[1].split("/")[0])
            context = tls_context(str(ca), str(client.cert), str(client.key))
            assert await tls_errors.probe_client_refusal("127.0.0.1", port, context, sent_cert=True,
                                                         timeout=1.0) is None  # fmt: skip
            # and a working mTLS connection still works
            tls = TlsConfig(ca=str(ca), cert=str(client.cert), key=str(client.key))
            async with open_mcp_pool([McpServerConfig("files", fake.url, tls=tls)], log=Events().log) as pool:
                assert "files" in pool.connections
            nursery.cancel_scope.cancel()
