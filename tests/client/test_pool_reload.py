"""A pool that a reload changes while it stays open (``McpPool.stage`` / ``commit``), against real MCP peers over
loopback HTTP: a call in flight on a replaced server finishes on its old connection, which then closes; the
next call goes to the new one; a required server that cannot be reached fails the stage and nothing changes."""

from __future__ import annotations

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.errors import McpConnectError, McpError
from tests.client.helpers import Events, server
from tests.durable.peer import counting_peer
from tests.waiting import until


async def test_a_call_in_flight_finishes_on_the_replaced_connection_then_it_closes():
    events = Events()
    async with counting_peer() as old_peer, counting_peer() as new_peer, \
            open_mcp_pool([server(f"{old_peer.origin}/mcp", "pay")], log=events.log) as pool:
        old = pool.connections["pay"]
        answers: list[str] = []

        async def call_in_flight() -> None:
            result = await pool.call_tool("pay", "lookup", {"key": "k1", "hold": "gate"})
            answers.append(result.content[0]["text"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call_in_flight)
            await until(lambda: old_peer.received, timeout=10, what="the call at the old peer")
            staged = await pool.stage([server(f"{new_peer.origin}/mcp", "pay"), server(f"{new_peer.origin}/mcp", "books")])
            assert staged.changes.to_json() == {"added": ["books"], "removed": [], "changed": ["pay"]}
            assert pool.connections == {"pay": old}  # staged, not in use yet
            await pool.commit(staged)
            assert list(pool.connections) == ["pay", "books"] and pool.connections["pay"] is not old
            assert {t.name for t in pool.tools()} == {"lookup", "charge"}
            await trio.sleep(0.2)  # real time: a window for a wrong close of the old connection to show
            assert old.connected and not old.exchange.closing  # held open for the call in flight
            old_peer.gate.set()
        assert answers == ["lookup k1 done (execution #1)"]  # answered on the old connection
        await until(lambda: old.exchange.closing, timeout=10, what="the old connection closing")
        await pool.call_tool("pay", "lookup", {"key": "k2"})
        assert [c["key"] for c in new_peer.executed] == ["k2"] and len(old_peer.executed) == 1


async def test_a_required_server_that_cannot_connect_fails_the_stage_and_changes_nothing():
    events = Events()
    async with counting_peer() as peer, \
            open_mcp_pool([server(f"{peer.origin}/mcp", "pay")], log=events.log) as pool:
        before = dict(pool.connections)
        down = server("http://127.0.0.1:9/mcp", "down", connect_timeout=2.0)
        with pytest.raises(McpConnectError, match="down"):
            await pool.stage([server(f"{peer.origin}/mcp", "pay"), server(f"{peer.origin}/mcp", "more"), down])
        assert pool.connections == before and [c.name for c in pool.declared] == ["pay"]
        assert len(peer.handshakes) == 2  # "more" was handshaked, then closed again with the failed stage
        await pool.call_tool("pay", "lookup", {"key": "k"})
        assert peer.count("lookup") == 1


async def test_a_removed_server_stays_callable_until_the_turns_in_flight_passed():
    events = Events()
    async with counting_peer() as peer, counting_peer() as gone_peer, open_mcp_pool(
            [server(f"{peer.origin}/mcp", "pay"), server(f"{gone_peer.origin}/mcp", "gone")], log=events.log) as pool:
        gone = pool.connections["gone"]
        turned = trio.Event()
        staged = await pool.stage([server(f"{peer.origin}/mcp", "pay")])
        await pool.commit(staged, turned.wait)
        assert list(pool.connections) == ["pay"] and {t.name for t in pool.tools()} == {"lookup", "charge"}
        await pool.call_tool("gone", "lookup", {"key": "late"})  # the turn in flight listed it: still served
        assert [c["key"] for c in gone_peer.executed] == ["late"]
        turned.set()
        await until(lambda: gone.exchange.closing, timeout=10, what="the removed connection closing")
        with pytest.raises(McpError, match="no connected MCP server named 'gone'"):
            await pool.call_tool("gone", "lookup", {"key": "later"})
