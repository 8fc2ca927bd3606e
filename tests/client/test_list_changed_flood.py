"""A flood of ``notifications/tools/list_changed`` costs one re-list per interval, not one per notification.

A real MCP client (``open_mcp_pool``) against the hostile peer's ``get_flood`` behaviour (tests/peers/hostile.py),
whose standing GET stream sends list_changed notifications without end, on loopback.
"""

from __future__ import annotations

import trio

from agentd import defaults
from agentd.client.pool import open_mcp_pool
from tests.client.fakeserver import serve_fake
from tests.client.helpers import Events, server
from tests.peers.hostile import BEHAVIOURS
from tests.waiting import until


async def test_a_list_changed_flood_is_coalesced() -> None:
    events = Events()
    async with trio.open_nursery() as nursery:
        peer = await nursery.start(serve_fake, BEHAVIOURS["get_flood"])
        async with open_mcp_pool([server(peer.url, "s")], log=events.log):
            started = trio.current_time()
            await until(lambda: len(events.named("mcp.list_changed")) >= 2, timeout=30, what="the flood read")
            # real time: the fake peer floods over a real socket for three relist intervals
            await trio.sleep(3 * defaults.RELIST_INTERVAL)
            elapsed = trio.current_time() - started
            listed = sum(1 for r in peer.requests if r.rpc_method == "tools/list")
            noticed = len(events.named("mcp.list_changed"))
        nursery.cancel_scope.cancel()
    # one listing at connect, then at most one per interval (however many thousand notifications arrived)
    most = 1 + int(elapsed / defaults.RELIST_INTERVAL) + 1
    assert 2 <= listed <= most, (listed, most)
    assert noticed <= most, noticed  # a notification already pending adds no log line
