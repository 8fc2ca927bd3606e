"""Daemon modes (loop, schedule, reactive), the reactive router and the self-scheduling tools.

See docs/reactive.md. ``agentd.daemon`` reaches this package through :func:`agentd.modes.entry.daemon_mode`
(imported when a daemon mode runs); ``--mode once`` imports only :mod:`agentd.modes.once` (its in-run
``subscribe`` and ``await_resource``), and only when it has an MCP server.
"""
