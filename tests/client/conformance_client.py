"""The client program the MCP conformance harness runs: ``python tests/client/conformance_client.py <url>``.

It switches on ``MCP_CONFORMANCE_SCENARIO`` (as the reference clients do) and drives agentd's own MCP client
(:func:`agentd.client.open_mcp_pool`). Exit 0 when the scenario's part ran, 1 otherwise.

Scenarios of the 2026-07-28 revision only (conformance 0.2.0-alpha.12) run with ``era: modern`` (the default
``auto`` sends ``initialize`` first, as the spec pins). The tool calls a scenario asks for in
``MCP_CONFORMANCE_CONTEXT`` (``toolCalls``) are made as given.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.telemetry.events import EventLog, stream_sink

#: Scenarios that exist only in the 2026-07-28 revision: agentd speaks it from the first request (era: modern).
MODERN_ONLY = frozenset({"request-metadata", "http-standard-headers", "http-custom-headers",
                         "http-invalid-tool-headers", "json-schema-ref-no-deref", "sep-2322-client-request-state"})


async def run(url: str, scenario: str) -> int:
    log = EventLog(sink=stream_sink(sys.stderr), level="info", comp="conformance")
    era = "modern" if scenario in MODERN_ONLY else "auto"
    config = McpServerConfig("conformance", url, connect_timeout=10.0, call_timeout=20.0, era=era)
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    async with open_mcp_pool([config], log=log, run_id="conformance") as pool:
        names = [tool.name for tool in pool.tools()]
        calls = context.get("toolCalls") if isinstance(context, dict) else None
        if calls:
            for item in calls:
                result = await pool.call_tool("conformance", item["name"], item.get("arguments") or {})
                print(item["name"], result.content, file=sys.stderr)
            return 0
        if scenario == "json-schema-2020-12-preservation":
            # Echo the rich tool's inputSchema, as received, through the permissive tool.
            tools = pool.tools()
            focal = next(t for t in tools if "$defs" in (t.input_schema or {}))
            echo = next(t for t in tools if t is not focal)
            result = await pool.call_tool("conformance", echo.name, {"schema": focal.input_schema})
            return 1 if result.is_error else 0
        if scenario in ("http-standard-headers", "http-invalid-tool-headers"):
            for name in names:
                await pool.call_tool("conformance", name, {})
            for resource in pool.resources():
                await pool.read_resource(resource.uri, server="conformance")
            return 0
        if scenario == "sep-2322-client-request-state":
            # Every tool at once: each input_required round stays with its own call.
            failed: list[str] = []

            async def call(name: str) -> None:
                result = await pool.call_tool("conformance", name, {})
                print(name, result.content, file=sys.stderr)
                if result.is_error:
                    failed.append(name)

            async with trio.open_nursery() as nursery:
                for name in names:
                    nursery.start_soon(call, name)
            return 1 if failed else 0
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
