"""The HTTP transport knows no tool names: which requests stream is the handler's call
(``McpHandler.streams``), so a new long-running tool never needs a transport change."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from agentd.selfmcp.tools import TOOL_NAMES

#: The served surface's modules: the table and every app it mounts, with what they share.
SERVED = ("asgi_server", "asgi", "mounts", "gate", "mcp_app", "mcp_handler", "sse_response", "events_app",
          "probes_app", "resource_metadata_app", "ui_app")


@pytest.mark.parametrize("name", SERVED)
def test_transport_module_names_no_tool(name: str) -> None:
    module = importlib.import_module(f"agentd.transport.{name}")
    source = Path(str(module.__file__)).read_text(encoding="utf-8")
    assert "subagent" not in source.lower()  # grep-style: code, comments and docstrings
    strings = {node.value for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    # "status" is a tool name and also an ASGI message key; every other tool name must be absent.
    assert not strings & (set(TOOL_NAMES) - {"status"})


def test_surface_streams_only_a_synchronous_spawn() -> None:
    from agentd.mcp.jsonrpc import Request
    from agentd.selfmcp.surface import AgentInfo, SelfMcpSurface

    surface = SelfMcpSurface(None, AgentInfo("r", "loop"))  # type: ignore[arg-type]  # streams() needs no backend

    def call(name: str, arguments: object) -> Request:
        return Request(1, "tools/call", {"name": name, "arguments": arguments})

    assert surface.streams(call("subagent.spawn", {"instruction": "x"}))
    assert surface.streams(call("subagent.spawn", None))
    assert not surface.streams(call("subagent.spawn", {"instruction": "x", "async": True}))
    assert not surface.streams(call("subagent.spawn", {"instruction": "x", "warm": True}))
    assert not surface.streams(call("subagent.spawn", ["not", "an", "object"]))
    assert not surface.streams(call("status", {}))
    assert not surface.streams(Request(1, "resources/read", {"uri": "agent://status"}))
    assert not surface.streams(Request(1, "tools/call", None))
