"""agentd's configuration: the frozen :class:`Config` and the layers that build it.

``load_config(argv, env)`` is exactly what the CLI does: defaults < ``--config`` YAML file <
environment (``AGENTD_<FLAG>``, ``AGENT_<FLAG>`` accepted) < flags, then validation; every problem is a
one-line :class:`~agentd.errors.ConfigError` (exit 2) raised before any network or process side effect.

The exports are resolved lazily (PEP 562): ``agentd --help``, ``--version`` and the CLI's early
``--log-format`` look-up import only :mod:`agentd.config.argv` (the flag table), and importing a submodule
must not pay for the loader, the validator and the MCP URL rules behind it. The model never imports its
loader: ``load_config`` is a function of :mod:`agentd.config.load`, not a method of ``Config``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentd.config import load as load
    from agentd.config.durations import parse_duration as parse_duration
    from agentd.config.load import load_config as load_config
    from agentd.config.model import Config as Config
    from agentd.config.model import McpServerConfig as McpServerConfig
    from agentd.config.model import TlsConfig as TlsConfig

__all__ = ["Config", "McpServerConfig", "TlsConfig", "load_config", "parse_duration"]

_LAZY = {
    "Config": "agentd.config.model",
    "McpServerConfig": "agentd.config.model",
    "TlsConfig": "agentd.config.model",
    "parse_duration": "agentd.config.durations",
    "load_config": "agentd.config.load",
}


def __getattr__(name: str) -> Any:
    if name == "load":
        return importlib.import_module("agentd.config.load")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentd.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
