"""The process-level client TLS contexts: built once, never for plain http, never weaker than before."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import TlsConfig
from agentd.errors import McpConnectError
from agentd.intelligence import open_intelligence
from agentd.telemetry.events import null_log
from agentd.transport import http_client, tls
from tests.client.fakeserver import Req, Resp, mcp_answer, serve_fake
from tests.client.helpers import Events, server
from tests.client.test_tls import server_context
from tests.peers.gateway import scripted_gateway, text
from tests.selfmcp.certs import make_ca, make_pki

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    """Start from an empty cache so a test can see what a run builds (restored afterwards)."""
    saved = (tls._default, tls._trust, tls._plain, dict(tls._by_files))
    tls._default, tls._trust, tls._plain = None, None, None
    tls._by_files.clear()
    yield
    tls._default, tls._trust, tls._plain = saved[0], saved[1], saved[2]
    tls._by_files.clear()
    tls._by_files.update(saved[3])


def test_default_context_is_built_once_and_trusts_the_system_store(fresh_cache: None) -> None:
    first = tls.default_context()
    assert tls.default_context() is first
    assert first.verify_mode is ssl.CERT_REQUIRED and first.check_hostname
    assert first.cert_store_stats()["x509_ca"] > 50  # the OS store (certifi's bundle only without one)
    assert http_client.new_client()._transport._pool._ssl_context is first  # type: ignore[attr-defined]


def test_plain_context_trusts_nothing_but_still_verifies(fresh_cache: None) -> None:
    plain = tls.plain_context()
    assert tls.plain_context() is plain
    assert plain.cert_store_stats()["x509_ca"] == 0
    assert plain.verify_mode is ssl.CERT_REQUIRED and plain.check_hostname
    assert tls._default is None  # building it loaded no bundle


def test_verify_for_picks_the_bundle_only_when_some_url_is_https(fresh_cache: None) -> None:
    assert tls.verify_for(["http://127.0.0.1:1/mcp", "HTTP://localhost/v1"]) is tls.plain_context()
    assert tls._default is None
    assert tls.verify_for(["http://127.0.0.1:1/mcp", "HTTPS://gw.example/v1"]) is tls.default_context()
    assert tls.verify_for([]) is tls.plain_context()


def test_client_context_is_cached_per_files_and_rebuilt_when_they_change(tmp_path: Path, fresh_cache: None) -> None:
    pki = make_pki(tmp_path / "pki")
    ca_only = tls.client_context(str(pki.ca), None, None)
    assert tls.client_context(str(pki.ca), None, None) is ca_only
    assert ca_only.cert_store_stats()["x509_ca"] == 1  # only the private CA, not the public bundle
    mutual = tls.client_context(str(pki.ca), str(pki.client.cert), str(pki.client.key))
    assert mutual is not ca_only
    assert tls.client_context(str(pki.ca), str(pki.client.cert), str(pki.client.key)) is mutual
    assert tls.client_context(None, None, None) is tls.default_context()
    # Rotation: a new CA file at the same path gives a new context; the cache keeps one entry per paths.
    make_ca(tmp_path / "pki", "ca")
    rotated = tls.client_context(str(pki.ca), None, None)
    assert rotated is not ca_only
    assert len([k for k in tls._by_files if k[0] == str(pki.ca) and k[1] is None]) == 1
    with pytest.raises(OSError):
        tls.client_context(str(tmp_path / "missing.pem"), None, None)


async def test_plain_http_runs_load_no_ca_bundle(fresh_cache: None) -> None:
    """A pool and an intelligence client that only reach http:// endpoints never build the public context."""
    async def handler(req: Req, resp: Resp) -> None:
        await mcp_answer(req, resp)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            fake = await nursery.start(functools.partial(serve_fake, handler))
            async with scripted_gateway([text("plain")]) as gw:
                async with open_mcp_pool([server(fake.url, "a")], log=Events().log) as pool, \
                        open_intelligence([gw.url], log=null_log()) as intel:
                    assert (await pool.call_tool("a", "t", {})).content[0]["text"] == "ok"
                    assert (await intel.complete(USER, [])).content == "plain"
            nursery.cancel_scope.cancel()
    assert tls._default is None


async def test_https_still_verifies_with_the_cached_contexts(tmp_path: Path, fresh_cache: None) -> None:
    """The cache changes cost, not trust: a private-CA peer fails with the default context and passes with
    the configured CA; a second pool over the same files reuses the context."""
    pki = make_pki(tmp_path)

    async def handler(req: Req, resp: Resp) -> None:
        await mcp_answer(req, resp)

    log = null_log()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            fake = await nursery.start(functools.partial(serve_fake, handler,
                                                         tls=server_context(pki, require_client=False)))
            with pytest.raises(McpConnectError):
                async with open_mcp_pool([server(fake.url, "a")], log=Events().log):
                    pass
            assert tls._default is not None  # an https server: the public bundle was loaded (once)
            for _ in range(2):
                async with open_mcp_pool([server(fake.url, "a", tls=TlsConfig(ca=str(pki.ca)))],
                                         log=Events().log) as pool:
                    assert (await pool.call_tool("a", "t", {})).content[0]["text"] == "ok"
            assert len(tls._by_files) == 1
            # (The intelligence side refusing an untrusted gateway is tests/intelligence/test_gateway.py's.)
            async with scripted_gateway([text("over tls")], certfile=str(pki.server.cert),
                                        keyfile=str(pki.server.key)) as gw:
                verify = tls.client_context(str(pki.ca), None, None)
                async with open_intelligence([gw.url], log=log, verify=verify) as intel:
                    assert (await intel.complete(USER, [])).content == "over tls"
            nursery.cancel_scope.cancel()


def test_the_fork_server_warm_up_builds_what_children_would_pay_for(fresh_cache: None) -> None:
    """Children inherit the fork server's state: the public context and httpcore's lazy imports are in it."""
    import sys

    from agentd.child import forkserver

    forkserver._preimport()
    assert tls._default is not None
    assert {"httpcore._backends.trio", "encodings.idna", "agentd.transport.tls"} <= set(sys.modules)
    assert set(forkserver.PREIMPORT) <= set(sys.modules)
