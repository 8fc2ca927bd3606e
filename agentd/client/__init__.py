"""The MCP client role: one connection per declared server, in either protocol era, behind one pool.

See docs/mcp-client.md for the behaviour and docs/architecture.md § MCP client for the contract.
"""

from typing import TYPE_CHECKING

from agentd.deferred.lazy import lazy_exports

if TYPE_CHECKING:
    from agentd.client._streams import Tuning as Tuning
    from agentd.client.connection import ServerConnection as ServerConnection
    from agentd.client.era_cache import EraCache as EraCache
    from agentd.client.era_cache import process_era_cache as process_era_cache
    from agentd.client.errors import ResponseStreamBroken as ResponseStreamBroken
    from agentd.client.models import ResourceContents as ResourceContents
    from agentd.client.models import ResourceInfo as ResourceInfo
    from agentd.client.models import ResourceTemplateInfo as ResourceTemplateInfo
    from agentd.client.models import ResourceUpdated as ResourceUpdated
    from agentd.client.models import ToolInfo as ToolInfo
    from agentd.client.models import ToolResult as ToolResult
    from agentd.client.pool import McpPool as McpPool
    from agentd.client.pool import open_mcp_pool as open_mcp_pool

__all__ = [
    "EraCache",
    "McpPool",
    "ResourceContents",
    "ResourceInfo",
    "ResourceTemplateInfo",
    "ResourceUpdated",
    "ResponseStreamBroken",
    "ServerConnection",
    "ToolInfo",
    "ToolResult",
    "Tuning",
    "open_mcp_pool",
    "process_era_cache",
]

#: Resolved on first use (PEP 562): a run without MCP servers opens an empty pool and never loads the
#: connection, the MCP session, its cattrs types or httpx.
_LAZY = {
    "Tuning": "agentd.client._streams",
    "ServerConnection": "agentd.client.connection",
    "EraCache": "agentd.client.era_cache",
    "process_era_cache": "agentd.client.era_cache",
    "ResponseStreamBroken": "agentd.client.errors",
    "ResourceContents": "agentd.client.models",
    "ResourceInfo": "agentd.client.models",
    "ResourceTemplateInfo": "agentd.client.models",
    "ResourceUpdated": "agentd.client.models",
    "ToolInfo": "agentd.client.models",
    "ToolResult": "agentd.client.models",
    "McpPool": "agentd.client.pool",
    "open_mcp_pool": "agentd.client.pool",
}


__getattr__ = lazy_exports("agentd.client", _LAZY, globals())
