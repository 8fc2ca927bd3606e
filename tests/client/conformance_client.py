"""The client program the MCP conformance harness runs: ``python tests/client/conformance_client.py <url>``.

It switches on ``MCP_CONFORMANCE_SCENARIO`` (as the reference clients do) and drives agentd's own MCP client
(:func:`agentd.client.open_mcp_pool`). Exit 0 when the scenario's part ran, 1 otherwise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.events import EventLog, stream_sink


async def run(url: str, scenario: str) -> int:
    log = EventLog(sink=stream_sink(sys.stderr), level="info", comp="conformance")
    config = McpServerConfig("conformance", url, connect_timeout=10.0, call_timeout=20.0)
    async with open_mcp_pool([config], log=log, run_id="conformance") as pool:
        names = [tool.name for tool in pool.tools()]
        if scenario == "tools_call":
            result = await pool.call_tool("conformance", "add_numbers", {"a": 2, "b": 3})
            print(result.content, file=sys.stderr)
            return 1 if result.is_error else 0
        if scenario == "sse-retry":
            result = await pool.call_tool("conformance", "test_reconnection", {})
            print(result.content, file=sys.stderr)
            return 1 if result.is_error else 0
        print(f"connected; tools: {names}", file=sys.stderr)
    return 0


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: conformance_client.py <server-url>", file=sys.stderr)
        return 2
    return trio.run(run, sys.argv[-1], os.environ.get("MCP_CONFORMANCE_SCENARIO", "initialize"))


if __name__ == "__main__":
    sys.exit(main())
