"""Liveness of an idle modern-wire (2026-07-28) connection: that wire has no ``ping``, so an idle connection asks
``server/discover``; three unanswered in a row mark it stale and it reconnects, as the legacy pinger does.

Scripted in-process peers on loopback, on trio's autojump clock (the 30 s idle interval and 10 s timeout are
the design's defaults).
"""

from __future__ import annotations

from typing import Any

import trio

from agentd.client import open_mcp_pool
from agentd.client.era_cache import EraCache
from agentd.mcp.versions import Era
from tests.client.fakeserver import Req, Resp, error, mcp_answer, result, serve_fake
from tests.client.helpers import Events, server

#: No listChanged and no subscribe: the connection opens no listen stream, so nothing else talks while idle.
QUIET_CAPS: dict[str, Any] = {"tools": {}}


def quiet_modern_peer(state: dict[str, Any]) -> Any:
    """A modern-only peer; ``server/discover`` is answered unless ``state["hang"]`` (then it never answers)."""

    async def handler(req: Req, resp: Resp) -> None:
        method = req.rpc_method
        if req.method != "POST":
            await resp.body(405, b"", content_type="text/plain")
            return
        if method == "initialize":
            await resp.json(error(req, -32602, "missing _meta envelope"), status=400)
            return
        assert method != "ping", "the 2026-07-28 wire has no ping"
        if method == "server/discover":
            state["discovers"] += 1
            if state["hang"]:
                state["hung"] += 1
                if state["hung"] >= 3:
                    state["hang"] = False  # the reconnect's discover is answered again
                await trio.sleep_forever()
            await resp.json(result(req, {"supportedVersions": ["2026-07-28"], "capabilities": QUIET_CAPS,
                                         "serverInfo": {"name": "m", "version": "1"}, "ttlMs": 0}))
        else:
            await mcp_answer(req, resp)

    return handler


async def test_idle_modern_connection_asks_discover_and_stays_up(autojump_clock: trio.abc.Clock) -> None:
    state = {"discovers": 0, "hang": False, "hung": 0}
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, quiet_modern_peer(state))
        async with open_mcp_pool([server(fake.url)], log=events.log, eras=EraCache()) as pool:
            conn = pool.connections["s"]
            assert conn.era is Era.MODERN
            after_handshake = state["discovers"]
            await trio.sleep(29)
            assert state["discovers"] == after_handshake  # nothing while the connection was recently used
            await trio.sleep(66)  # to 95 s: asked at about 30, 60 and 90 s of silence
            assert conn.connected and conn.generation == 1
        nursery.cancel_scope.cancel()
    assert state["discovers"] - after_handshake == 3
    assert "ping" not in fake.methods() and "GET" not in fake.methods()
    assert not events.named("mcp.ping_missed") and not events.named("mcp.reconnect")


async def test_a_busy_modern_connection_is_not_asked(autojump_clock: trio.abc.Clock) -> None:
    state = {"discovers": 0, "hang": False, "hung": 0}
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, quiet_modern_peer(state))
        async with open_mcp_pool([server(fake.url)], log=Events().log, eras=EraCache()) as pool:
            after_handshake = state["discovers"]
            for _ in range(6):  # a request every 20 s for two minutes: never 30 s of silence
                await trio.sleep(20)
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()
    assert state["discovers"] == after_handshake


async def test_three_unanswered_discovers_mark_stale_and_reconnect(autojump_clock: trio.abc.Clock) -> None:
    state = {"discovers": 0, "hang": False, "hung": 0}
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, quiet_modern_peer(state))
        async with open_mcp_pool([server(fake.url)], log=events.log, eras=EraCache()) as pool:
            conn = pool.connections["s"]
            state["hang"] = True  # the server stops answering (a hung process, a silent partition)
            start = trio.current_time()
            with trio.fail_after(300):
                while conn.generation < 2 or not conn.connected:
                    await trio.sleep(1)
            elapsed = trio.current_time() - start
            assert conn.era is Era.MODERN
        nursery.cancel_scope.cancel()
    assert [e["misses"] for e in events.named("mcp.ping_missed")] == [1, 2, 3]
    assert len(events.named("mcp.stale")) == 1 and len(events.named("mcp.reconnect")) >= 1
    # 30 s idle, 10 s timeout, three times; then the reconnect (its first attempt is immediate).
    assert 3 * 40 - 1 <= elapsed <= 3 * 40 + 10
    assert state["hung"] == 3
    assert "ping" not in fake.methods()
