"""An MCP server that asks its client to sample *with tools* (2025-11-25, SEP-1577): FastMCP from ``mcp<2``, run
from ``.peers/mcp1-venv`` like ``legacy_sdk_server.py`` (npm server-everything has no such tool).

Its one tool, ``forecast``, runs the loop a server runs: a ``sampling/createMessage`` offering its own
``get_weather`` tool; if the client's model asks for it (``tool_use`` content), the server runs it and sends a
second request with the ``tool_use`` and its ``tool_result`` in the history. The tool's result is the JSON of
both answers (``first``, ``second``), so a test sees exactly what the client returned. Each request rides on
the tool call's own response stream (``related_request_id``), as a server's requests during a call do. The SDK refuses to send
``tools`` to a client that did not declare ``sampling.tools`` (the tool call then fails).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import types
from mcp.server.fastmcp import Context, FastMCP

try:
    from tests.peers.servers.uvicorn_peer import parse_peer_args, serve_app
except ModuleNotFoundError:  # run as a script (perhaps from another venv): this directory is on sys.path
    from uvicorn_peer import parse_peer_args, serve_app  # type: ignore[no-redef]

WEATHER = types.Tool(name="get_weather", description="The weather in a city now.",
                     inputSchema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def build(host: str) -> FastMCP:
    mcp = FastMCP("agentd-sampling-test-peer", host=host, log_level="WARNING")

    @mcp.tool(description="Ask the client's model for a forecast, offering it get_weather.")
    async def forecast(city: str, ctx: Context, choice: str = "auto") -> str:  # type: ignore[type-arg]
        messages = [types.SamplingMessage(role="user", content=types.TextContent(
            type="text", text=f"What should I wear in {city} today?"))]
        tool_choice = types.ToolChoice(mode=choice)  # type: ignore[arg-type]
        first = await ctx.session.create_message(messages, max_tokens=200, system_prompt="You are a forecaster.",
                                                 tools=[WEATHER], tool_choice=tool_choice,
                                                 related_request_id=ctx.request_id)
        out: dict[str, Any] = {"first": first.model_dump(mode="json", exclude_none=True)}
        uses = [block for block in first.content_as_list if block.type == "tool_use"]
        if uses:
            results: list[Any] = [types.ToolResultContent(type="tool_result", toolUseId=use.id, content=[
                types.TextContent(type="text", text=f"sunny, 21 C in {use.input.get('city')}")]) for use in uses]
            messages += [types.SamplingMessage(role="assistant", content=first.content_as_list),
                         types.SamplingMessage(role="user", content=results)]
            second = await ctx.session.create_message(messages, max_tokens=200, tools=[WEATHER],
                                                      related_request_id=ctx.request_id)
            out["second"] = second.model_dump(mode="json", exclude_none=True)
        return json.dumps(out)

    return mcp


async def serve() -> None:
    args = parse_peer_args("an MCP server that samples with tools (FastMCP, mcp<2)")
    await serve_app(build(args.host).streamable_http_app(), args.host, args.port)


if __name__ == "__main__":
    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(0)
