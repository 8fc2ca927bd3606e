"""Where a connection's OAuth / client-credentials auth comes from: the process's installed credential source.

A host ``connections:`` entry with ``auth: client_credentials`` or ``auth: oauth`` reaches the pool as settings
(``McpServerConfig.credentials``, references only). Turning them into per-request auth (discovery, token
requests, the runtime module's provider) is agentd.connections' work, a layer above the client; so the
composition that owns the process (the daemon, a child agentd) installs a :class:`CredentialSource` here and
the pool asks it, per server, for an ``httpx.Auth``.

Why a context variable (like the operator and the drain latch): every run of a process (a once run, each
wake, each served spawn) opens its pool somewhere below the daemon, and threading a parameter through each
of those layers for a setting most runs never use would widen every signature. The source also keeps one
token cache per connection for the whole process, so a daemon's runs share a token until it expires.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import httpx

    from agentd.config.model import McpServerConfig
    from agentd.telemetry.events import EventLog


class CredentialSource(Protocol):
    """Builds (or returns the process's cached) per-request auth for one server's credential settings."""

    def auth_for(self, server: McpServerConfig, log: EventLog) -> httpx.Auth:
        """The auth for ``server`` (whose ``credentials`` is set).

        Raises:
            McpConnectError: the credentials cannot be set up (a missing variable, no provider): the server
                fails to connect like any other, naming it and never a secret value.
        """
        ...


_CURRENT: ContextVar[CredentialSource | None] = ContextVar("agentd_credentials", default=None)


@contextlib.contextmanager
def use_credentials(source: CredentialSource) -> Iterator[CredentialSource]:
    """Install ``source`` for the pools opened in this context (and the tasks it starts)."""
    token = _CURRENT.set(source)
    try:
        yield source
    finally:
        _CURRENT.reset(token)


def current_credentials() -> CredentialSource | None:
    """The installed source, or None (then a server with credential settings fails to connect, saying why)."""
    return _CURRENT.get()
