"""Auth and bad input, each refused cleanly while a well-behaved client keeps being served."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agentd.errors import ConfigError, ExitCode
from agentd.selfmcp.surface import SelfMcpLimits
from agentd.transport.serve import ServeConfig, check_serve_config
from tests.selfmcp.certs import issue, make_ca, make_pki
from tests.selfmcp.harness import ACCEPT, LegacyPeer, rpc, serving
from tests.waiting import until

TOKEN = "s3cret-token-for-tests"


async def _well_behaved(peer: LegacyPeer) -> None:
    assert (await peer.call("ping"))["result"] == {}


async def _handshaken(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> httpx.Response | None:
    """The answer to ``body``, or None while the TLS handshake is refused (the new files not read yet)."""
    try:
        return await client.post(url, headers=ACCEPT, json=body)
    except httpx.TransportError:
        return None


async def test_bearer_wrong_missing_and_tampered_are_401() -> None:
    async with serving(bearer=TOKEN) as s, httpx.AsyncClient() as client:
        good = LegacyPeer(client, s.url, headers={"authorization": f"Bearer {TOKEN}"})
        await good.initialize()
        init = rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                  "clientInfo": {"name": "x", "version": "0"}})
        for auth in (None, "Bearer wrong", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN):
            headers = dict(ACCEPT)
            if auth is not None:
                headers["authorization"] = auth
            r = await client.post(s.url, headers=headers, json=init)
            assert r.status_code == 401, auth
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert TOKEN not in r.text
            await _well_behaved(good)
        # a session id learnt elsewhere does not stand in for the token
        r = await client.post(s.url, headers={**ACCEPT, "mcp-session-id": good.session}, json=rpc("ping"))
        assert r.status_code == 401


async def test_bad_origin_and_host_are_403() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        good = LegacyPeer(client, s.url)
        await good.initialize()
        port = s.serving.port
        init = rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                  "clientInfo": {"name": "x", "version": "0"}})
        r = await client.post(s.url, headers={**ACCEPT, "origin": "https://evil.example.com"}, json=init)
        assert r.status_code == 403
        r = await client.post(s.url, headers={**ACCEPT, "host": "evil.example.com", "origin": "http://evil.example.com"},
                              json=init)
        assert r.status_code == 403
        r = await client.post(s.url, headers={**ACCEPT, "origin": f"http://localhost:{port}"}, json=init)
        assert r.status_code == 200
        await _well_behaved(good)


async def test_oversized_body_is_413_and_malformed_is_32700() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        good = LegacyPeer(client, s.url)
        await good.initialize()
        big = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * (8 * 1024 * 1024) + b'"}}'
        r = await client.post(s.url, headers=good.headers(), content=big)
        assert r.status_code == 413
        r = await client.post(s.url, headers=good.headers(), content=b'{"jsonrpc":"2.0",')
        assert r.status_code == 400 and r.json()["error"]["code"] == -32700
        r = await good.post("resources/read", {"uri": 42})
        assert r.json()["error"]["code"] == -32602
        await _well_behaved(good)


async def test_chunked_oversized_body_is_413() -> None:
    async with serving(max_body=1024) as s, httpx.AsyncClient() as client:
        good = LegacyPeer(client, s.url)
        await good.initialize()

        async def chunks():
            for _ in range(10):
                yield b"x" * 200

        r = await client.post(s.url, headers=good.headers(), content=chunks())
        assert r.status_code == 413
        await _well_behaved(good)


async def test_session_flood_is_capped_at_64() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        good = LegacyPeer(client, s.url)
        await good.initialize()
        for _ in range(63):
            await LegacyPeer(client, s.url).initialize()
        r = await client.post(s.url, headers=ACCEPT, json=rpc("initialize", {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}))
        assert r.status_code == 503
        assert "session limit" in r.json()["error"]["message"]
        await _well_behaved(good)
        await client.delete(s.url, headers={"mcp-session-id": good.session})
        await LegacyPeer(client, s.url).initialize()  # room again


async def test_slowloris_is_cut_off_while_others_are_served() -> None:
    async with serving(header_timeout=0.5) as s, httpx.AsyncClient() as client:
        good = LegacyPeer(client, s.url)
        await good.initialize()
        sock = await trio.open_tcp_stream("127.0.0.1", s.serving.port)
        await sock.send_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        with trio.fail_after(5):
            closed = False
            while not closed:
                await _well_behaved(good)
                try:
                    await sock.send_all(b"X-Slow: 1\r\n")
                    with trio.move_on_after(0.2):
                        data = await sock.receive_some(100)
                        closed = data == b"" or data.startswith(b"HTTP/1.1 4")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    closed = True
        await sock.aclose()
        await _well_behaved(good)


def test_non_loopback_bind_without_auth_is_a_startup_error(tmp_path: Path) -> None:
    for url in ("http://0.0.0.0:8080", "http://10.1.2.3:80/mcp"):
        with pytest.raises(ConfigError) as info:
            check_serve_config(ServeConfig(url=url))
        assert info.value.exit_code == ExitCode.USAGE
    check_serve_config(ServeConfig(url="http://0.0.0.0:8080", bearer="t"))
    check_serve_config(ServeConfig(url="http://127.0.0.1:0"))  # loopback dev: allowed
    with pytest.raises(ConfigError):
        check_serve_config(ServeConfig(url="https://127.0.0.1:0"))  # no cert/key
    with pytest.raises(ConfigError):
        check_serve_config(ServeConfig(url="ftp://127.0.0.1:0"))


async def test_mtls_requires_a_certificate_from_the_right_ca(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    async with serving(pki=pki, mtls=True) as s:
        async with httpx.AsyncClient(verify=pki.client_context(pki.client), timeout=5) as good_client:
            good = LegacyPeer(good_client, s.url)
            await good.initialize()
            for context in (pki.client_context(None), pki.client_context(pki.rogue_client)):
                async with httpx.AsyncClient(verify=context, timeout=5) as bad:
                    with pytest.raises(httpx.TransportError):
                        await bad.post(s.url, headers=ACCEPT, json=rpc("ping"))
                await _well_behaved(good)
            # plain HTTP to the TLS port
            async with httpx.AsyncClient(timeout=5) as plain:
                with pytest.raises(httpx.TransportError):
                    await plain.post(s.url.replace("https://", "http://"), headers=ACCEPT, json=rpc("ping"))
            await _well_behaved(good)


async def test_tls_with_bearer(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    async with serving(pki=pki, bearer=TOKEN) as s:
        async with httpx.AsyncClient(verify=pki.client_context(None), timeout=5) as client:
            r = await client.post(s.url, headers=ACCEPT, json=rpc("ping"))
            assert r.status_code == 401
            good = LegacyPeer(client, s.url, headers={"authorization": f"Bearer {TOKEN}"})
            await good.initialize()
            await _well_behaved(good)


async def test_certificate_rotation_without_restart(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "one")
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(pki.server.cert, live / "server.crt")
    shutil.copy(pki.server.key, live / "server.key")
    new_dir = tmp_path / "two"
    new_dir.mkdir()
    new_ca, new_ca_cert, new_ca_key = make_ca(new_dir, "new-ca")
    rotated = issue(new_dir, "server2", new_ca_cert, new_ca_key, server=True)
    trusts_new = httpx.AsyncClient(verify=__import__("ssl").create_default_context(cafile=str(new_ca)), timeout=5)
    async with serving(pki=pki, cert=live / "server.crt", key=live / "server.key", reload_interval=0.05) as s:
        async with trusts_new, httpx.AsyncClient(verify=pki.client_context(None), timeout=5) as old_client:
            assert (await old_client.post(s.url, headers=ACCEPT, json=rpc("initialize", {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "x", "version": "0"}}))).status_code == 200
            with pytest.raises(httpx.TransportError):
                await trusts_new.post(s.url, headers=ACCEPT, json=rpc("ping"))
            # rotate: write the key first, then the certificate (a half-written pair must not break serving)
            shutil.copy(rotated.key, live / "server.key.tmp")
            shutil.copy(rotated.cert, live / "server.crt.tmp")
            (live / "server.key.tmp").replace(live / "server.key")
            (live / "server.crt.tmp").replace(live / "server.crt")
            init = rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                      "clientInfo": {"name": "x", "version": "0"}})
            r = await until(lambda: _handshaken(trusts_new, s.url, init), timeout=5, what="the rotated cert served")
            assert r.status_code == 200


async def test_subscription_limit_per_session() -> None:
    async with serving(limits=SelfMcpLimits(max_subscriptions=2, max_concurrent_spawns=8)) as s, \
            httpx.AsyncClient() as client:
        peer = LegacyPeer(client, s.url)
        await peer.initialize()
        uris = []
        for _ in range(3):
            r = await peer.call("tools/call", {"name": "subagent.spawn",
                                               "arguments": {"instruction": "sleep=5", "async": True}})
            uris.append("agent://subagent/" + r["result"]["structuredContent"]["handle"])
        assert "result" in await peer.call("resources/subscribe", {"uri": uris[0]})
        assert "result" in await peer.call("resources/subscribe", {"uri": uris[1]})
        over = await peer.call("resources/subscribe", {"uri": uris[2]})
        assert over["error"]["code"] == -32602 and "subscription limit" in over["error"]["message"]


async def test_client_ca_rotation_without_restart(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    live_ca = tmp_path / "clients-ca.crt"
    shutil.copy(pki.ca, live_ca)
    init = rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "x", "version": "0"}})
    from agentd.transport.serve import Serving, serve_mcp

    async with trio.open_nursery() as nursery:
        from agentd.selfmcp.surface import AgentInfo, SelfMcpSurface
        from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
        from tests.selfmcp.backend import TaskBackend

        surface = SelfMcpSurface(TaskBackend(nursery), AgentInfo("r", "loop"))
        await nursery.start(surface.run)
        app = McpAsgiApp(surface, AsgiOptions())
        cfg = ServeConfig(url="https://127.0.0.1:0/mcp", cert=pki.server.cert, key=pki.server.key,
                          client_ca=live_ca, reload_interval=0.05)
        stop = trio.Event()
        info: Serving = await nursery.start(lambda task_status: serve_mcp(app, cfg, shutdown_trigger=stop.wait,
                                                                         task_status=task_status))
        url = f"https://127.0.0.1:{info.port}/mcp"
        ours = httpx.AsyncClient(verify=pki.client_context(pki.client), timeout=5)
        rogue = httpx.AsyncClient(verify=pki.client_context(pki.rogue_client), timeout=5)
        async with ours, rogue:
            assert (await ours.post(url, headers=ACCEPT, json=init)).status_code == 200
            with pytest.raises(httpx.TransportError):
                await rogue.post(url, headers=ACCEPT, json=init)
            # the operator now trusts the other CA only
            shutil.copy(pki.rogue_ca, tmp_path / "next.crt")
            (tmp_path / "next.crt").replace(live_ca)
            r = await until(lambda: _handshaken(rogue, url, init), timeout=5, what="the new client CA trusted")
            assert r.status_code == 200
            fresh = httpx.AsyncClient(verify=pki.client_context(pki.client), timeout=5)
            async with fresh:
                with pytest.raises(httpx.TransportError):
                    await fresh.post(url, headers=ACCEPT, json=init)
        stop.set()
        nursery.cancel_scope.cancel()


async def test_header_timeout_does_not_cut_open_streams() -> None:
    # The header/idle timeout applies between requests, not to a GET stream or a long answer in progress.
    async with serving(header_timeout=0.3, keepalive=0.2) as s, httpx.AsyncClient(timeout=10) as client:
        peer = LegacyPeer(client, s.url)
        await peer.initialize()
        got = b""
        with trio.fail_after(5):
            async with client.stream("GET", s.url, headers={**peer.headers(), "accept": "text/event-stream"}) as r:
                with trio.move_on_after(1.2):
                    async for chunk in r.aiter_bytes():
                        got += chunk
        assert got.count(b": keepalive") >= 3  # still open well past the 0.3 s header timeout
        spawn = await peer.call("tools/call", {"name": "subagent.spawn", "arguments": {"instruction": "sleep=1"}})
        assert spawn["result"]["structuredContent"]["status"] == "completed"
