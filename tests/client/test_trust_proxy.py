"""What agentd trusts (OS store + SSL_CERT_FILE/SSL_CERT_DIR, certifi as the fallback), environment proxies
(HTTPS_PROXY through a real CONNECT proxy, NO_PROXY, loopback never proxied) and the wrong-endpoint hint."""

from __future__ import annotations

import functools
import json
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.errors import ConfigError, McpConnectError
from agentd.intelligence import open_intelligence
from agentd.telemetry.events import null_log
from agentd.transport import tls
from agentd.transport.http_client import new_client
from agentd.transport.proxy import ProxyEnv
from tests.cli.helpers import clean_env
from tests.client.fakeserver import Req, Resp, mcp_answer, serve_fake
from tests.client.helpers import Events, server
from tests.client.test_tls import server_context
from tests.peers.connect_proxy import connect_proxy
from tests.peers.gateway import scripted_gateway, text
from tests.selfmcp.certs import make_pki

#: A name that looks remote; only the test proxy (which connects to 127.0.0.1 whatever it is asked) resolves it.
REMOTE = "mcp.proxied.test"
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
              "NO_PROXY", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR")


@pytest.fixture
def fresh_trust(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No proxy or SSL_CERT_* from the outer environment, and an empty context cache (restored afterwards)."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    saved = (tls._default, tls._trust, tls._plain, dict(tls._by_files))
    tls._default, tls._trust, tls._plain = None, None, None
    tls._by_files.clear()
    yield
    tls._default, tls._trust, tls._plain = saved[0], saved[1], saved[2]
    tls._by_files.clear()
    tls._by_files.update(saved[3])


async def answer(req: Req, resp: Resp) -> None:
    await mcp_answer(req, resp)


async def call_once(url: str) -> str:
    async with open_mcp_pool([server(url, "a")], log=Events().log) as pool:
        result = await pool.call_tool("a", "t", {})
    text_: str = result.content[0]["text"]
    return text_


def test_the_default_context_is_the_system_store_loaded_once(fresh_trust: None) -> None:
    trust = tls.default_trust()
    assert trust == tls.Trust("system")  # this machine has an OS store: certifi's bundle is not loaded
    context = tls.default_context()
    assert tls.default_context() is context
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    if sys.platform.startswith("linux"):
        # Not truststore's wrapper, which re-reads the bundle on every handshake: the same files, loaded once.
        assert type(context) is ssl.SSLContext
        assert context.cert_store_stats()["x509_ca"] > 50
        before = context.cert_store_stats()
        context.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname="example.com")
        assert context.cert_store_stats() == before


async def test_a_ca_only_in_ssl_cert_file_is_trusted(tmp_path: Path, fresh_trust: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pki = make_pki(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            fake = await nursery.start(functools.partial(serve_fake, answer,
                                                         tls=server_context(pki, require_client=False)))
            assert await call_once(fake.url) == "ok"
            nursery.cancel_scope.cancel()
    assert tls.default_trust() == tls.Trust("system", cert_file=str(pki.ca))
    # In addition to the system store, not instead of it.
    assert tls.default_context().cert_store_stats()["x509_ca"] > 50


async def test_a_ca_in_ssl_cert_dir_is_trusted(tmp_path: Path, fresh_trust: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    pki = make_pki(tmp_path / "pki")
    certs = tmp_path / "certs"
    certs.mkdir()
    digest = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(pki.ca)], capture_output=True,
                            text=True, check=True).stdout.strip()
    (certs / f"{digest}.0").write_bytes(pki.ca.read_bytes())
    monkeypatch.setenv("SSL_CERT_DIR", str(certs))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            fake = await nursery.start(functools.partial(serve_fake, answer,
                                                         tls=server_context(pki, require_client=False)))
            assert await call_once(fake.url) == "ok"
            nursery.cancel_scope.cancel()
    assert tls.default_trust().cert_dir == str(certs)


async def test_a_ca_in_neither_store_is_refused_with_a_clear_error(tmp_path: Path, fresh_trust: None) -> None:
    pki = make_pki(tmp_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            fake = await nursery.start(functools.partial(serve_fake, answer,
                                                         tls=server_context(pki, require_client=False)))
            with pytest.raises(McpConnectError) as caught:
                await call_once(fake.url)
            nursery.cancel_scope.cancel()
    message = str(caught.value)
    assert "certificate verify failed: unable to get local issuer certificate" in message
    assert "not trusted" in message and "SSL_CERT_FILE" in message and "--tls-ca" in message
    assert fake.requests == []  # nothing was sent over the unverified connection


def test_without_a_system_store_certifi_is_the_fallback(fresh_trust: None, monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """A minimal container: no OpenSSL default paths and none of the usual distribution files."""
    real = ssl.get_default_verify_paths()
    missing = str(tmp_path / "none")
    monkeypatch.setattr(ssl, "get_default_verify_paths", lambda: real._replace(
        cafile=None, capath=None, openssl_cafile=missing, openssl_capath=missing))
    monkeypatch.setattr(tls, "_LINUX_CA_FILES", (missing,))
    context, trust = tls.build_default({})
    assert trust.store == "certifi" and trust.fallback_reason == "no system trust store was found"
    assert context.cert_store_stats()["x509_ca"] > 50


# -- proxies ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "env", "expected"), [
    ("https://api.example.com/v1", {"HTTPS_PROXY": "http://p:3128"}, "http://p:3128"),
    ("https://api.example.com/v1", {"https_proxy": "http://p:3128"}, "http://p:3128"),
    ("http://api.example.com/v1", {"HTTPS_PROXY": "http://p:3128"}, None),
    ("http://api.example.com/v1", {"HTTP_PROXY": "http://p:80"}, "http://p:80"),
    ("https://api.example.com/v1", {"ALL_PROXY": "http://p:1"}, "http://p:1"),
    ("https://127.0.0.1:8443/mcp", {"HTTPS_PROXY": "http://p:3128"}, None),
    ("https://127.9.8.7/mcp", {"HTTPS_PROXY": "http://p:3128"}, None),
    ("https://[::1]:9/mcp", {"HTTPS_PROXY": "http://p:3128"}, None),
    ("https://localhost:9/mcp", {"HTTPS_PROXY": "http://p:3128"}, None),
    ("https://api.example.com/v1", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "example.com"}, None),
    ("https://api.example.com/v1", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": ".example.com"}, None),
    ("https://api.example.com/v1", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "*.example.com"}, None),
    ("https://badexample.com/v1", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "example.com"}, "http://p:3128"),
    ("https://api.example.com/v1", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "*"}, None),
    ("https://10.1.2.3/v1", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "10.0.0.0/8"}, None),
    ("https://11.1.2.3/v1", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "10.0.0.0/8"}, "http://p:3128"),
    ("https://a.internal:8443/", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "a.internal:8443"}, None),
    ("https://a.internal/", {"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "a.internal:8443"}, "http://p:3128"),
    ("https://api.example.com/v1", {}, None),
    ("https://api.example.com/v1", {"HTTPS_PROXY": "proxy.corp:3128"}, "http://proxy.corp:3128"),
])
def test_which_requests_are_proxied(url: str, env: dict[str, str], expected: str | None) -> None:
    assert ProxyEnv.from_environ(env).proxy_for(url) == expected


@pytest.mark.parametrize("value", ["socks5://user:hunter2@127.0.0.1:1080", "ftp://user:hunter2@127.0.0.1:21"])
def test_an_unsupported_proxy_is_a_configuration_error_without_its_credentials(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        new_client(environ={"HTTPS_PROXY": value})
    assert "supports http:// and https:// proxies" in str(caught.value)
    assert "hunter2" not in str(caught.value) and "user" not in str(caught.value)


async def test_https_proxy_tunnels_a_remote_name_and_never_loopback(tmp_path: Path, fresh_trust: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pki = make_pki(tmp_path, names=(REMOTE,))
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery, connect_proxy() as proxy:
            fake = await nursery.start(functools.partial(serve_fake, answer,
                                                         tls=server_context(pki, require_client=False)))
            port = fake.url.split(":")[2].split("/")[0]
            monkeypatch.setenv("HTTPS_PROXY", proxy.url)
            # The loopback address: direct, although NO_PROXY is unset.
            assert await call_once(fake.url) == "ok"
            assert await call_once(f"https://localhost:{port}/mcp") == "ok"
            assert proxy.tunnels == []
            # A name only the proxy can resolve: through the tunnel, TLS verified end to end.
            assert await call_once(f"https://{REMOTE}:{port}/mcp") == "ok"
            assert proxy.tunnels and set(proxy.tunnels) == {f"{REMOTE}:{port}"}  # (POST, GET stream, DELETE)
            tunnelled = len(proxy.tunnels)
            # NO_PROXY naming loopback changes nothing; its other forms are test_which_requests_are_proxied's
            # (a direct attempt at the remote name would leave loopback to resolve it).
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            assert await call_once(fake.url) == "ok"
            assert len(proxy.tunnels) == tunnelled
            nursery.cancel_scope.cancel()


async def test_the_gateway_goes_through_https_proxy(tmp_path: Path, fresh_trust: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pki = make_pki(tmp_path, names=("gw.proxied.test",))
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    with trio.fail_after(30):
        async with connect_proxy() as proxy, scripted_gateway(
            [text("through the proxy")], certfile=str(pki.server.cert), keyfile=str(pki.server.key)
        ) as gw:
            monkeypatch.setenv("HTTPS_PROXY", proxy.url)
            port = gw.url.split(":")[2].split("/")[0]
            remote = gw.url.replace(f"127.0.0.1:{port}", f"gw.proxied.test:{port}")
            async with open_intelligence([remote], log=null_log()) as intel:
                reply = await intel.complete([{"role": "user", "content": "hi"}], [])
            assert reply.content == "through the proxy"
            assert proxy.tunnels and set(proxy.tunnels) == {f"gw.proxied.test:{port}"}


# -- the wrong-endpoint hint -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [404, 405])
async def test_a_wrong_endpoint_gets_a_hint_through_the_cli(status: int) -> None:
    async def not_here(req: Req, resp: Resp) -> None:
        await resp.body(status, b"Not Found" if status == 404 else b"", content_type="text/plain")

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            fake = await nursery.start(functools.partial(serve_fake, not_here))
            proc = await trio.run_process(
                [sys.executable, "-m", "agentd", "--instruction", "x", "--intelligence", "test",
                 "--mcp", f"wrong={fake.url.removesuffix('/mcp')}/sse"],
                env=clean_env(), stdin=b"", capture_stdout=True, capture_stderr=True, check=False,
            )
            nursery.cancel_scope.cancel()
    stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 6, stderr
    document = json.loads(stdout)
    assert document["status"] == "mcp_failed"
    hint = "is the path right? MCP servers usually serve at /mcp"
    assert hint in stdout + stderr
    assert "SSE-only (2024-11-05) server" in stdout + stderr
    assert f"HTTP {status}" in stdout + stderr
