"""The separator between a connection's name and its tool's name in what the model sees (``docs__search``).

A leaf, so the config checks (a connection name may not contain it) and the gateway's name map
(agentd.intelligence.names) share one constant without the config layer importing the gateway client.
"""

from __future__ import annotations

from typing import Final

SEPARATOR: Final = "__"
