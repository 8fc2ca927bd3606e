"""docs/recipes.md "stdio servers": a stdio-only MCP server behind npm's supergateway, started as its own
service, is an ordinary Streamable HTTP server to agentd (server-everything in its stdio mode)."""

from __future__ import annotations

import os

import pytest
import trio

from agentd.client import open_mcp_pool
from tests.client.helpers import Events, server
from tests.peers import launch


async def test_a_stdio_server_through_supergateway() -> None:
    bridge = launch.NODE_MODULES / "supergateway" / "dist" / "index.js"
    if not bridge.exists():
        if os.environ.get("AGENTD_TEST_REQUIRE_PEERS") == "1":
            pytest.fail("npm supergateway is not installed (run scripts/test)")
        pytest.skip("npm supergateway is not installed (run scripts/test)")
    with launch.start_stdio_bridge() as peer, trio.fail_after(60):
        async with open_mcp_pool([server(peer.url, "stdio")], log=Events().log) as pool:
            assert "echo" in [t.name for t in pool.tools()]
            result = await pool.call_tool("stdio", "echo", {"message": "through the bridge"})
    assert "through the bridge" in result.content[0]["text"]
