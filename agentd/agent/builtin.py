"""``resource.read``: the built-in attention tool every agent has.

The prompt lists resources (awareness); this tool fetches one body on demand (attention). A URI the
catalogue lists is read from the server that listed it; an unlisted URI (a template expansion, a link
found in a tool result) is tried on every connected server in declaration order, first hit wins. A
missing resource is an ``isError`` observation, never a run abort (spec §1.5).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agentd.agent.control import ControlContext, ControlResult, ControlTool
from agentd.agent.prompt import ResourceLike
from agentd.errors import McpError, ResourceNotFound

NAME = "resource.read"

INPUT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "uri": {"type": "string", "minLength": 1, "description": "The resource URI to read."},
        "server": {"type": "string", "description": "Optional: the server to read it from."},
    },
    "required": ["uri"],
    "additionalProperties": False,
}


class ContentsLike(Protocol):
    @property
    def contents(self) -> Sequence[Mapping[str, Any]]: ...


class ResourceReader(Protocol):
    """What this tool needs from the MCP pool."""

    @property
    def connections(self) -> Mapping[str, Any]: ...
    def resources(self) -> Sequence[ResourceLike]: ...
    async def read_resource(self, uri: str, server: str | None = None) -> Any: ...


def resource_read_tool(pool: ResourceReader) -> ControlTool:
    """The ``resource.read`` control tool bound to one run's pool."""

    async def handler(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        uri = str(arguments["uri"])
        server = arguments.get("server")
        if server is not None and server not in pool.connections:
            known = ", ".join(sorted(pool.connections)) or "none"
            return ControlResult.text(f"unknown server {server!r} (connected: {known})", is_error=True)
        candidates = [server] if server is not None else _candidates(pool, uri)
        if not candidates:
            return ControlResult.text("no MCP server is connected", is_error=True)
        faults: list[str] = []
        for name in candidates:
            try:
                read = await pool.read_resource(uri, server=name)
            except ResourceNotFound:
                continue
            except McpError as exc:
                faults.append(f"{name}: {exc}")
                continue
            items = tuple({"type": "resource", "resource": dict(item)} for item in read.contents)
            return ControlResult(items or ({"type": "text", "text": f"[resource {uri} is empty]"},))
        if faults:
            return ControlResult.text(f"could not read {uri}: " + "; ".join(faults), is_error=True)
        where = f"server {server!r}" if server is not None else "any connected server"
        return ControlResult.text(f"resource not found on {where}: {uri}", is_error=True)

    return ControlTool(
        name=NAME,
        description=(
            "Read the body of a resource by URI (from the resource list in the system message, or any URI a "
            "tool gave you). Optional 'server' picks the MCP server; otherwise the listing server is used and "
            "an unlisted URI is tried on every server."
        ),
        input_schema=INPUT_SCHEMA,
        handler=handler,
    )


def _candidates(pool: ResourceReader, uri: str) -> list[str]:
    listed = [r.server for r in pool.resources() if r.uri == uri and r.server in pool.connections]
    rest = [name for name in pool.connections if name not in listed]
    return list(dict.fromkeys(listed)) + rest
