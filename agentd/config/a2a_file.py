"""The config file's ``a2a_peers:`` list: entries shaped like ``mcp_servers`` (agentd.config.servers).

:mod:`agentd.config.file` calls :func:`load_peers` when a file has the key (cattrs only then).
"""

from __future__ import annotations

from typing import Any

from agentd.config.a2a import CALL_TIMEOUT
from agentd.config.model import McpServerConfig
from agentd.config.servers import load_servers


def load_peers(raw: Any, base_dir: str) -> tuple[McpServerConfig, ...]:
    """The ``a2a_peers:`` section: a list of entries shaped like ``mcp_servers`` entries (A2A's call timeout)."""
    if raw is None:
        return ()
    return load_servers(raw, base_dir, section="a2a_peers", kind="peer", call_timeout=CALL_TIMEOUT, tags=False,
                        taggable=True)
