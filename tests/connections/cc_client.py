"""A conformance client for the ``auth/client-credentials-*`` scenarios, on agentd's client-credentials auth.

Run by the harness as ``python tests/connections/cc_client.py <server-url>`` with ``MCP_CONFORMANCE_CONTEXT``
holding ``client_id`` and ``client_secret``, or ``private_key_pem`` (and ``signing_algorithm``). It connects
through ``open_mcp_pool`` with :class:`ClientCredentialsAuth` on the server entry (discovery, token, retry),
lists the tools and calls the first one, exactly as ``agentd run`` would.
"""

from __future__ import annotations

import json
import os
import sys

import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.connections.auth import ClientCredentialsAuth, ClientCredentialsSettings
from agentd.telemetry.events import EventLog, stream_sink


async def main(url: str) -> int:
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    settings = ClientCredentialsSettings(
        client_id=context["client_id"],
        client_secret=context.get("client_secret"),
        private_key_pem=context.get("private_key_pem"),
        signing_algorithm=context.get("signing_algorithm"),
    )
    log = EventLog(sink=stream_sink(sys.stderr), level="debug")
    auth = ClientCredentialsAuth(settings, "conformance", url, log)
    server = McpServerConfig(name="conformance", url=url, auth=auth, connect_timeout=20.0)
    with trio.fail_after(25):
        async with open_mcp_pool([server], log=log) as pool:
            tools = pool.tools()
            if tools:
                await pool.call_tool("conformance", tools[0].name, {})
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[-1]))
