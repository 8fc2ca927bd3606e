"""The credential source of a plain agentd process: OAuth and client-credentials connections outside ``agentd run``.

``agentd run`` builds each bound connection's auth itself (agentd.connections.cli). Every other process —
a daemon in any mode, a ``--serve-mcp`` worker, the child agentd of a subagent or a served spawn — opens its
MCP pools below the daemon, so the daemon (or the child program) installs a :class:`HostCredentials` as the
process's credential source (agentd.client.credentials) and the pool asks it per server:

* ``client_credentials``: a :class:`~agentd.connections.auth.ClientCredentialsAuth` from the server's
  references, resolved here (the client id and secret, a ``private_key_jwt`` PEM), with the config's
  ``egress.allow`` for the discovered URLs.
* ``oauth``: a :class:`~agentd.connections.auth.ProviderAuth` over the ``--runtime-module``'s
  ``connection_credentials`` provider (the module is loaded on the first such connection, once).

One auth per connection (and redactor) for the life of the process: a daemon's wakes and runs share the
token, renewed shortly before it expires, and an OAuth credential found past its expiry is invalidated with
``reason: "expired"`` before a fresh one is asked for. Anything that cannot be set up fails that server's
connection like a refused handshake, naming the server and never a secret value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import httpx

from agentd.config.model import ConnectionCredentials, McpServerConfig
from agentd.connections.auth import (
    ClientCredentialsAuth,
    ClientCredentialsSettings,
    ConnectionAuthError,
    ProviderAuth,
)
from agentd.errors import AgentdError
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog, Redactor
from agentd.transport.egress import EgressPolicy


@attrs.define(eq=False)
class HostCredentials:
    """The process's :class:`agentd.client.credentials.CredentialSource` for host ``connections:`` entries."""

    env: Mapping[str, str]
    egress: EgressPolicy = attrs.field(factory=EgressPolicy)
    runtime_module: str | None = None
    _provider: Any = None
    _cache: dict[tuple[str, str, ConnectionCredentials, int], tuple[httpx.Auth, Redactor]] = attrs.field(
        factory=dict)

    def auth_for(self, server: McpServerConfig, log: EventLog) -> httpx.Auth:
        spec = server.credentials
        if spec is None:
            raise ConnectionAuthError(f"connection {server.name!r} has no credential settings", server=server.name,
                                      code="connection_credentials_unavailable")  # fmt: skip
        key = (server.name, server.url, spec, id(log.redactor))
        cached = self._cache.get(key)
        if cached is not None:
            return cached[0]
        auth = self._build(server, spec, log)
        self._cache[key] = (auth, log.redactor)  # the redactor is held so its id names it while cached
        return auth

    def _build(self, server: McpServerConfig, spec: ConnectionCredentials, log: EventLog) -> httpx.Auth:
        if spec.type == "oauth":
            return ProviderAuth(self._credential_provider(server), server.name, server.name, spec.profile or "",
                                server.url, log, run_id=log.run_id or "")  # fmt: skip
        resolver = SecretResolver(env=self.env, redactor=log.redactor)
        try:
            client_id = resolver.resolve(spec.client_id or "")
            secret = resolver.resolve(spec.client_secret) if spec.client_secret is not None else None
            pem = resolver.resolve(spec.private_key) if spec.private_key is not None else None
        except AgentdError as exc:  # a missing variable: its name, never a value
            raise ConnectionAuthError(f"connection {server.name!r}: client_credentials: {exc}", server=server.name,
                                      code="connection_credentials_unavailable") from None  # fmt: skip
        if pem is not None:
            for line in pem.splitlines():  # a PEM is multi-line: each body line is secret on its own
                if len(line) >= 16 and not line.startswith("-----"):
                    log.redactor.add(line)
        settings = ClientCredentialsSettings(
            client_id=client_id, client_secret=secret, private_key_pem=pem, scopes=spec.scopes,
            method=spec.token_endpoint_auth_method, signing_algorithm=spec.signing_algorithm,
        )  # fmt: skip
        return ClientCredentialsAuth(settings, server.name, server.url, log, egress=self.egress)

    def _credential_provider(self, server: McpServerConfig) -> Any:
        if self._provider is None:
            from agentd.connections.runtime import load_runtime_module

            try:
                module = load_runtime_module(self.runtime_module)
            except AgentdError as exc:
                raise ConnectionAuthError(f"connection {server.name!r}: {exc}", server=server.name,
                                          code="connection_credentials_unavailable") from None  # fmt: skip
            if module.connection_credentials is None:
                raise ConnectionAuthError(
                    f"connection {server.name!r} uses auth type oauth; the runtime module must export "
                    "connection_credentials (--runtime-module)", server=server.name,
                    code="connection_credentials_unavailable")  # fmt: skip
            self._provider = module.connection_credentials
        return self._provider


def needs_credentials(servers: tuple[McpServerConfig, ...]) -> bool:
    """Whether any of ``servers`` authenticates through a credential source (so one must be installed)."""
    return any(server.credentials is not None for server in servers)


__all__ = ("HostCredentials", "needs_credentials")
