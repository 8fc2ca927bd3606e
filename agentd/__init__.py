"""agentd: an MCP-native agent daemon on trio."""

from agentd._version import __version__ as __version__
