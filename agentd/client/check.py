"""``agentd check``: connect to every declared server and describe what an agent would be able to do.

The document lists every declared server in declaration order: connected ones with their era,
negotiated version, serverInfo, capabilities, instructions, tools and resources; failed ones with the
error. Header values are never printed, endpoints lose userinfo and query, and every string passes the
log's redactor, so a resolved secret cannot reach stdout.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentd.client.connection import ServerConnection
from agentd.client.pool import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.errors import ExitCode
from agentd.mcp import tasks as mcp_tasks
from agentd.mcp import types
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog, Redactor
from agentd.transport.http_client import display_url


def _describe(conn: ServerConnection) -> dict[str, Any]:
    return {
        "connected": True,
        "era": conn.era.value if conn.era else None,
        "protocolVersion": conn.protocol_version,
        "serverInfo": types.unstructure(conn.server_info) if conn.server_info else None,
        "capabilities": conn.capabilities,
        "instructions": conn.instructions,
        "tools": [
            {
                "name": t.name,
                "hash": conn.catalogue.hashes.get(t.name),
                "title": t.title,
                "description": t.description,
                "inputSchema": t.input_schema,
                "outputSchema": t.output_schema,
                "annotations": t.annotations,
                # How agentd calls it: "task" for a tool the server runs only as a task (agentd.mcp.tasks).
                "calledAs": mcp_tasks.call_mode(conn.era, t.task_support, conn.capabilities).value,
            }
            for t in conn.tools
        ],
        # Listed, but agentd cannot call them here (not offered), with why.
        "unusableTools": [{"name": name, "reason": reason} for name, reason in conn.catalogue.unusable.items()],
        # A pinned server's tools that do not match the pin: not offered; their hash is the listed one.
        "refusedTools": [
            {"name": name, "hash": conn.catalogue.hashes.get(name), "pinned": pinned}
            for name, pinned in conn.catalogue.refused.items()
        ],
        "resources": [
            {"uri": r.uri, "name": r.name, "description": r.description, "mimeType": r.mime_type, "size": r.size}
            for r in conn.resources
        ],
        "resourceTemplates": [
            {"uriTemplate": t.uri_template, "name": t.name, "description": t.description, "mimeType": t.mime_type}
            for t in conn.templates
        ],
    }


def _scrub(value: Any, redactor: Redactor) -> Any:
    if isinstance(value, str):
        return redactor.scrub(value)
    if isinstance(value, dict):
        return {k: _scrub(v, redactor) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, redactor) for v in value]
    return value


async def run_check(
    servers: Iterable[McpServerConfig], *, log: EventLog, secrets: SecretResolver | None
) -> tuple[dict[str, Any], int]:
    """The JSON document for ``agentd check`` and its exit code (0, or 6 when a required server failed)."""
    declared = list(servers)
    entries: list[dict[str, Any]] = []
    code = ExitCode.OK
    async with open_mcp_pool(declared, log=log, secrets=secrets, run_id=log.run_id, raise_required=False) as pool:
        for config in declared:
            entry: dict[str, Any] = {
                "name": config.name,
                "endpoint": display_url(config.url),
                "required": config.required,
            }
            conn = pool.connections.get(config.name)
            if conn is not None:
                entry.update(_describe(conn))
            else:
                failure = pool.failed.get(config.name)
                entry.update({"connected": False, "error": str(failure) if failure else "not connected"})
                if config.required:
                    code = ExitCode.MCP_REQUIRED
            entries.append(entry)
    document = {"ok": code == ExitCode.OK, "servers": entries}
    return _scrub(document, log.redactor), int(code)
