"""A reference MCP client on the official SDK 2.x for the conformance harness's client mode.

Run by the harness as ``python reference_client.py <server-url>`` with ``MCP_CONFORMANCE_SCENARIO`` set. It proves
the client-mode plumbing (``tests/peers/conformance.py``) can report a pass; agentd's own client is tested the same
way with its own command.
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp import Client


async def main(url: str) -> int:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    async with Client(url, mode="legacy") as client:
        tools = await client.list_tools()
        if scenario == "tools_call":
            await client.call_tool("add_numbers", {"a": 1, "b": 2})
        print(f"{scenario}: {len(tools.tools)} tools", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[-1]))
