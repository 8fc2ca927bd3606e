"""The era verdict is cached per origin: a later pool or a reconnect to a modern-only origin skips the refused
``initialize``; a verdict that no longer holds is dropped and the origin probed again; network errors are no
verdict. Request counts come from the peers themselves."""

from __future__ import annotations

import pytest
import trio

from agentd.client import EraCache, Tuning, open_mcp_pool, process_era_cache
from agentd.client.era_cache import origin
from agentd.errors import McpConnectError
from agentd.mcp.versions import Era
from tests.client.fakeserver import mcp_answer, serve_fake
from tests.client.helpers import Events, server
from tests.peers import launch
from tests.waiting import until


def test_origin_is_scheme_host_port() -> None:
    assert origin("http://LocalHost:8080/mcp?x=1") == "http://localhost:8080"
    assert origin("https://example.com/a") == origin("https://EXAMPLE.com:443/b") == "https://example.com:443"
    assert origin("http://[::1]/mcp") == "http://[::1]:80"
    cache = EraCache()
    cache.record_modern("http://127.0.0.1:9/a", "2026-07-28")
    assert cache.modern("http://127.0.0.1:9/other") == "2026-07-28" and cache.modern("http://127.0.0.1:10/a") is None
    assert cache.forget("http://127.0.0.1:9/") and not cache.forget("http://127.0.0.1:9/")
    assert len(cache) == 0


@pytest.mark.interop
async def test_later_pools_and_reconnects_skip_initialize() -> None:
    port = launch.free_port()
    eras = EraCache()
    tuning = Tuning(backoff_initial=0.05, backoff_max=0.2)
    peer = launch.start_peer(launch.modern_server_argv(port=port))
    try:
        url = peer.url
        events = Events()
        async with open_mcp_pool([server(url, "m")], log=events.log, eras=eras) as pool:
            assert pool.connections["m"].era is Era.MODERN
        assert eras.modern(url) == "2026-07-28"
        assert launch.stats(url)["requests"]["initialize"] == 1
        assert launch.stats(url)["requests"]["server/discover"] == 1
        # A later pool with the same cache goes straight to server/discover.
        async with open_mcp_pool([server(url, "m")], log=events.log, eras=eras) as pool:
            assert pool.connections["m"].era is Era.MODERN
        requests = launch.stats(url)["requests"]
        assert requests["initialize"] == 1 and requests["server/discover"] == 2
        assert [e.get("cached") for e in events.named("mcp.era")] == [False, True]
        # A pool with its own (empty) cache probes as on a cold start; the process cache was not touched.
        async with open_mcp_pool([server(url, "m")], log=Events().log, eras=EraCache()):
            pass
        assert launch.stats(url)["requests"]["initialize"] == 2 and len(process_era_cache()) == 0
        # A reconnect (the server restarts on the same port) goes straight to server/discover.
        async with open_mcp_pool([server(url, "m")], log=events.log, eras=eras, tuning=tuning) as pool:
            conn = pool.connections["m"]
            peer.stop()
            # the listen drops, the re-listen is refused: the connection is lost
            await until(lambda: not conn.connected, timeout=20, what="the connection lost")
            peer = launch.start_peer(launch.modern_server_argv(port=port))
            await until(lambda: conn.generation >= 2 and conn.connected, timeout=20, what="the reconnect")
            assert conn.era is Era.MODERN
            requests = launch.stats(url)["requests"]
            assert "initialize" not in requests and requests["server/discover"] == 1
    finally:
        peer.stop()


async def test_a_cached_verdict_that_no_longer_holds_is_dropped() -> None:
    eras = EraCache()
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, mcp_answer)  # a legacy-only server now behind the origin
        eras.record_modern(fake.url, "2026-07-28")
        async with open_mcp_pool([server(fake.url)], log=events.log, eras=eras) as pool:
            assert pool.connections["s"].era is Era.LEGACY
        assert fake.methods()[:3] == ["server/discover", "initialize", "notifications/initialized"]
        assert eras.modern(fake.url) is None
        assert [e.get("cache") for e in events.named("mcp.era")] == ["dropped", None]
        # With the entry gone, the next pool sends exactly the specified handshake first.
        count = len(fake.requests)
        async with open_mcp_pool([server(fake.url)], log=events.log, eras=eras):
            pass
        assert fake.methods()[count] == "initialize" and "server/discover" not in fake.methods()[count:]
        nursery.cancel_scope.cancel()


async def test_a_network_error_is_no_verdict() -> None:
    eras = EraCache()
    url = f"http://127.0.0.1:{launch.free_port()}/mcp"  # nothing listens there
    eras.record_modern(url, "2026-07-28")
    with trio.fail_after(10), pytest.raises(McpConnectError):
        async with open_mcp_pool([server(url, connect_timeout=2.0)], log=Events().log, eras=eras):
            pass
    assert eras.modern(url) == "2026-07-28"
