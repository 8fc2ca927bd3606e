"""The MCP pool: every declared server connected concurrently, behind one catalogue and one updates channel.

A required server that fails its handshake makes :func:`open_mcp_pool` raise :class:`McpConnectError`
(the CLI maps it to exit 6); an optional one is logged (``mcp.connect_failed``) and lands in
``pool.failed``. Updates from every server flow through one coalescing queue: a URI that changes
twice before the consumer reads once is delivered once (notify-then-read makes that lossless).
"""

from __future__ import annotations

import random
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from agentd import defaults
from agentd.client.era_cache import EraCache, process_era_cache
from agentd.client.models import (
    ResourceContents,
    ResourceInfo,
    ResourceTemplateInfo,
    ResourceUpdated,
    ToolInfo,
    ToolResult,
)
from agentd.config.model import McpServerConfig
from agentd.errors import AgentdError, McpConnectError, McpError, ResourceNotFound
from agentd.events import EventLog
from agentd.secrets import SecretResolver
from agentd.telemetry.health import readiness_check

if TYPE_CHECKING:  # a pool without servers connects nothing: the connection and httpx load with the first server
    import httpx

    from agentd.client._streams import Tuning
    from agentd.client.connection import ServerConnection
    from agentd.transport.egress import EgressPolicy


@attrs.define(eq=False)
class McpPool:
    log: EventLog
    run_id: str
    #: Connected servers, in declaration order.
    connections: dict[str, ServerConnection] = attrs.field(factory=dict)
    #: Servers that failed to connect (optional ones, or every one with ``raise_required=False``).
    failed: dict[str, AgentdError] = attrs.field(factory=dict)
    declared: list[McpServerConfig] = attrs.field(factory=list)
    #: Origins known to be modern-only, shared by every connection of the pool (and, by default, the process).
    eras: EraCache = attrs.field(factory=process_era_cache)
    _send: trio.MemorySendChannel[ResourceUpdated] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[ResourceUpdated] = attrs.field(init=False)
    _pending: dict[tuple[str, str], ResourceUpdated] = attrs.field(factory=dict)
    _pending_event: trio.Event = attrs.field(factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[ResourceUpdated](0)

    # -- catalogue ---------------------------------------------------------------------------------------

    def tools(self) -> list[ToolInfo]:
        return [tool for conn in self.connections.values() for tool in conn.tools]

    def resources(self) -> list[ResourceInfo]:
        return [res for conn in self.connections.values() for res in conn.resources]

    def resource_templates(self) -> list[ResourceTemplateInfo]:
        return [t for conn in self.connections.values() for t in conn.templates]

    def instructions(self) -> dict[str, str]:
        return {name: conn.instructions for name, conn in self.connections.items() if conn.instructions}

    # -- operations --------------------------------------------------------------------------------------

    def _connection(self, server: str) -> ServerConnection:
        conn = self.connections.get(server)
        if conn is None:
            known = ", ".join(self.connections) or "none"
            raise McpError(f"no connected MCP server named {server!r} (connected: {known})", server=server)
        return conn

    async def call_tool(
        self, server: str, tool: str, arguments: Mapping[str, Any] | None = None, *, run_id: str | None = None
    ) -> ToolResult:
        """Call a tool. ``isError`` comes back as a result; JSON-RPC errors raise McpRpcError."""
        return await self._connection(server).call_tool(
            tool, dict(arguments or {}), run_id=run_id if run_id is not None else self.run_id
        )

    def _owners(self, uri: str, server: str | None) -> list[ServerConnection]:
        if server is not None:
            return [self._connection(server)]
        listed = [c for c in self.connections.values() if c.catalogue.lists(uri)]
        return listed + [c for c in self.connections.values() if c not in listed]

    async def read_resource(self, uri: str, server: str | None = None) -> ResourceContents:
        """Read ``uri`` from ``server``, or from the server listing it, then every other one in turn."""
        owners = self._owners(uri, server)
        if not owners:
            raise ResourceNotFound(uri, -32002, "no MCP server is connected")
        last: ResourceNotFound | None = None
        for conn in owners:
            try:
                return await conn.read_resource(uri)
            except ResourceNotFound as exc:
                last = exc
        assert last is not None
        raise last

    def _subscribe_target(self, uri: str, server: str | None) -> ServerConnection | None:
        """The named server; else the one listing ``uri``; else the first that can push updates at all."""
        if server is not None:
            return self._connection(server)
        for conn in self.connections.values():
            if conn.catalogue.lists(uri):
                return conn
        capable = [c for c in self.connections.values() if c.can_subscribe()]
        return capable[0] if capable else next(iter(self.connections.values()), None)

    def can_subscribe(self, uri: str, server: str | None = None) -> bool:
        """Can ``uri`` be pushed to us (else the caller polls)?"""
        if server is not None and server not in self.connections:
            return False
        target = self._subscribe_target(uri, server)
        return target is not None and target.can_subscribe()

    async def subscribe(self, uri: str, server: str | None = None) -> bool:
        """Watch a concrete URI. False when its server cannot push changes (the caller should poll)."""
        target = self._subscribe_target(uri, server)
        if target is None:
            raise McpError(f"no connected MCP server can serve {uri!r}")
        return await target.subscribe(uri)

    async def unsubscribe(self, uri: str, server: str | None = None) -> None:
        for conn in self._owners(uri, server):
            if uri in conn.watched:
                await conn.unsubscribe(uri)

    def updates(self) -> trio.MemoryReceiveChannel[ResourceUpdated]:
        """The one channel of ``ResourceUpdated`` (server, uri): re-read the resource on each."""
        return self._receive

    def _on_update(self, server: str, uri: str, synthesized: bool) -> None:
        if not self._pending:
            # The consumer is already waiting (the usual case): hand the update over now instead of a
            # scheduling round later through the forwarder; a wake's latency budget is milliseconds.
            try:
                self._send.send_nowait(ResourceUpdated(server, uri, synthesized))
                return
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # busy or gone: the forwarder coalesces (and meets a closed channel) as before
        key = (server, uri)
        previous = self._pending.get(key)
        self._pending[key] = ResourceUpdated(server, uri, synthesized and (previous is None or previous.synthesized))
        self._pending_event.set()

    async def _forward_updates(self) -> None:
        while True:
            await self._pending_event.wait()
            while self._pending:
                key = next(iter(self._pending))
                update = self._pending.pop(key)
                await self._send.send(update)
            self._pending_event = trio.Event()

    # -- connecting --------------------------------------------------------------------------------------

    async def _start_one(
        self,
        nursery: trio.Nursery,
        config: McpServerConfig,
        client: httpx.AsyncClient,
        secrets: SecretResolver | None,
        tuning: Tuning,
        max_body: int,
    ) -> None:
        import httpx

        from agentd.client.connection import ServerConnection
        from agentd.transport.http_client import HttpTransport

        try:
            headers = secrets.resolve_headers(config.headers) if secrets is not None else dict(config.headers)
        except AgentdError as exc:
            self._fail(config, McpConnectError(f"MCP server {config.name!r}: {exc}", server=config.name))
            return
        conn = ServerConnection(
            config,
            HttpTransport(
                client, config.url, server=config.name, max_body=max_body,
                auth=config.auth if isinstance(config.auth, httpx.Auth) else None,
            ),
            self.log,
            self._on_update,
            extra_headers=headers,
            tuning=tuning,
            rng=random.Random(),
            eras=self.eras,
        )
        try:
            await nursery.start(conn.serve)
        except McpConnectError as exc:
            self._fail(config, exc)
            return
        self.connections[config.name] = conn

    def _fail(self, config: McpServerConfig, exc: McpConnectError) -> None:
        from agentd.transport.http_client import display_url

        self.failed[config.name] = exc
        self.log.emit(
            "mcp.connect_failed", "error" if config.required else "warn",
            server=config.name, url=display_url(config.url), required=config.required, error=str(exc),
        )  # fmt: skip

    def _order(self) -> None:
        self.connections = {c.name: self.connections[c.name] for c in self.declared if c.name in self.connections}


def _own_client(config: McpServerConfig) -> bool:
    """Does this server get its own client (a host policy, or private TLS material) instead of the shared one?"""
    return callable(config.http_client) or (config.tls is not None and bool(config.tls.ca or config.tls.cert))


def _client_for(
    config: McpServerConfig, shared: httpx.AsyncClient | None, egress: EgressPolicy | None
) -> httpx.AsyncClient | McpConnectError:
    import httpx

    from agentd.transport.http_client import new_client, tls_context

    if callable(config.http_client):
        # A host's HTTP policy (agentd.connections runtime module): its own client, transport and hooks.
        client = config.http_client()
        if not isinstance(client, httpx.AsyncClient):
            return McpConnectError(f"MCP server {config.name!r}: the HTTP policy gave no httpx.AsyncClient",
                                   server=config.name)  # fmt: skip
        return client
    if config.tls is None or not (config.tls.ca or config.tls.cert):
        assert shared is not None  # built whenever a declared server shares it
        return shared
    try:
        return new_client(verify=tls_context(config.tls.ca, config.tls.cert, config.tls.key), egress=egress)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc.__class__.__name__
        return McpConnectError(f"MCP server {config.name!r}: TLS material cannot be loaded ({reason})", server=config.name)


@asynccontextmanager
async def open_mcp_pool(
    servers: Iterable[McpServerConfig],
    *,
    log: EventLog,
    secrets: SecretResolver | None = None,
    run_id: str = "",
    raise_required: bool = True,
    tuning: Tuning | None = None,
    max_body: int = defaults.MAX_BODY,
    eras: EraCache | None = None,
    egress: EgressPolicy | None = None,
) -> AsyncIterator[McpPool]:
    """Connect every server concurrently and keep them connected while the block runs.

    ``eras`` remembers which origins are modern-only (2026-07-28), so their connections skip the refused
    ``initialize``; None means the per-process cache (:func:`agentd.client.era_cache.process_era_cache`).
    ``egress`` is the config file's ``egress.allow`` (a metadata address is refused unless it names it).

    Raises:
        McpConnectError: a required server failed its handshake (unless ``raise_required=False``, which
            ``agentd check`` uses to report every server).
    """
    declared: Sequence[McpServerConfig] = list(servers)
    pool = McpPool(
        log.bind(comp="mcp"), run_id, declared=list(declared), eras=eras if eras is not None else process_era_cache()
    )
    failure: McpConnectError | None = None
    if declared:
        from agentd.client._streams import Tuning
        from agentd.transport.http_client import new_client
        from agentd.transport.tls import verify_for
    async with AsyncExitStack() as stack:
        # Plain-http servers need no CA bundle; https ones share the process's cached context. With no server
        # that shares it (none declared, or each with its own client) none is built: a run without MCP servers
        # never loads httpcore's transports.
        sharing = [c.url for c in declared if not _own_client(c)]
        shared = (await stack.enter_async_context(new_client(verify=verify_for(sharing), egress=egress))
                  if sharing else None)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool._forward_updates)
            async with trio.open_nursery() as connecting:
                for config in declared:
                    client = _client_for(config, shared, egress)
                    if isinstance(client, McpConnectError):
                        pool._fail(config, client)
                        continue
                    if client is not shared:
                        await stack.enter_async_context(client)
                    connecting.start_soon(
                        pool._start_one, nursery, config, client, secrets, tuning or Tuning(), max_body
                    )
            pool._order()
            if raise_required:
                failure = next(
                    (
                        exc
                        for c in declared
                        if c.required and isinstance(exc := pool.failed.get(c.name), McpConnectError)
                    ),
                    None,
                )
            if failure is not None:
                nursery.cancel_scope.cancel()
            else:
                required = [c.name for c in declared if c.required]

                def connected() -> bool:  # readiness: every required server is connected right now
                    return all(name in pool.connections and pool.connections[name].connected for name in required)

                try:
                    with readiness_check(connected):
                        yield pool
                finally:
                    nursery.cancel_scope.cancel()
        # A consumer still reading updates() sees the end of the channel instead of waiting forever.
        pool._send.close()
    if failure is not None:
        raise failure
