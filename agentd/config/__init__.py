"""agentd's configuration: the frozen :class:`Config` and the layers that build it.

``Config.from_argv(argv, env)`` is exactly what the CLI does: defaults < ``--config`` YAML file <
environment (``AGENTD_<FLAG>``, ``AGENT_<FLAG>`` accepted) < flags, then validation; every problem is a
one-line :class:`~agentd.errors.ConfigError` (exit 2) raised before any network or process side effect.
"""

from agentd.config import load as load  # attaches Config.from_argv
from agentd.config.durations import parse_duration as parse_duration
from agentd.config.model import Config as Config
from agentd.config.model import McpServerConfig as McpServerConfig
from agentd.config.model import TlsConfig as TlsConfig

__all__ = ["Config", "McpServerConfig", "TlsConfig", "parse_duration"]
