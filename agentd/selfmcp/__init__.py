"""agentd's own MCP surface, served to peers (docs/self-mcp.md).

``surface`` (the five tools, ``agent://`` resources, the terminal-only ``updated``), ``subscriptions``
(who is subscribed, the one-shot emission rule), ``tools`` (names and schemas), ``backend`` (what the
supervisor must provide), ``supervised`` (the supervisor as that backend), ``serving`` (composition from a
Config, and the daemon's serve task).
"""
