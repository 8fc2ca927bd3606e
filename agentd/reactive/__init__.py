"""Daemon modes (loop, schedule, reactive), the reactive router and the self-scheduling tools.

See docs/reactive.md. ``agentd.daemon`` reaches this package through :func:`agentd.reactive.entry.daemon_mode`
(imported when a daemon mode runs); nothing here is imported by ``--mode once``.
"""
