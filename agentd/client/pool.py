"""The MCP pool: every declared server connected concurrently, behind one catalogue and one updates channel.

A required server that fails its handshake makes :func:`open_mcp_pool` raise :class:`McpConnectError`
(the CLI maps it to exit 6); an optional one is logged (``mcp.connect_failed``) and lands in
``pool.failed``. Updates from every server flow through one coalescing queue: a URI that changes
twice before the consumer reads once is delivered once (notify-then-read makes that lossless).

A reload (agentd.ctl) changes the servers of a pool that stays open, in two steps: :meth:`McpPool.stage`
connects what the new list adds or changes beside the running connections (a required one that fails
raises, and everything staged is closed again: nothing changed), :meth:`McpPool.commit` swaps them in.
A replaced or removed connection is retired: the turns in flight and the calls on it finish (bounded by
:data:`RETIRE_WAIT`), then it closes, shielded and bounded; a replaced server's subscriptions are made again on its new
connection, a removed server's are dropped.
"""

from __future__ import annotations

import functools
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from agentd import defaults
from agentd.client.era_cache import EraCache, process_era_cache
from agentd.config.model import McpServerConfig
from agentd.errors import AgentdError, McpConnectError, McpError, ResourceNotFound
from agentd.formats.ids import new_call_key
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from agentd.telemetry.health import readiness_check

if TYPE_CHECKING:  # a pool without servers connects nothing: the connection and httpx load with the first server
    import httpx

    from agentd.client._streams import Tuning
    from agentd.client.connection import ServerConnection
    from agentd.client.models import (
        ResourceContents,
        ResourceInfo,
        ResourceTemplateInfo,
        ResourceUpdated,
        ToolInfo,
        ToolResult,
    )
    from agentd.client.tasks import TaskStarted
    from agentd.transport.egress import EgressPolicy


#: How long a retired connection stays open at most, for the turns in flight to end and their calls to finish.
RETIRE_WAIT: Final = 300.0
#: Waits until the turns in flight when a reload swapped the servers have ended (agentd.oversight.operator).
TurnsPassed = Callable[[], Awaitable[None]]
#: ``delivery(uri, server)``: one ``resources/updated``, handed over as it arrives (:meth:`McpPool.deliver`).
Delivery = Callable[[str, str], None]


@attrs.frozen
class ServerChanges:
    """How a new server list differs from the running one, by name (a changed server is re-handshaked)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    def to_json(self) -> dict[str, list[str]]:
        return {"added": list(self.added), "removed": list(self.removed), "changed": list(self.changed)}


def server_changes(running: Sequence[McpServerConfig], new: Sequence[McpServerConfig]) -> ServerChanges:
    old = {c.name: c for c in running}
    names = [c.name for c in new]
    return ServerChanges(
        added=tuple(n for n in names if n not in old),
        removed=tuple(n for n in old if n not in names),
        changed=tuple(c.name for c in new if c.name in old and old[c.name] != c),
    )


class StagedServers:
    """Connections a reload opened beside the running ones (:meth:`McpPool.stage`), not yet in use.
    (A plain class, like :class:`McpPool`.)"""

    __slots__ = ("changes", "connections", "declared", "failed")

    def __init__(self, declared: list[McpServerConfig], changes: ServerChanges) -> None:
        self.declared = declared
        self.changes = changes
        self.connections: dict[str, ServerConnection] = {}
        self.failed: dict[str, AgentdError] = {}


@attrs.frozen
class _Opening:
    """How the pool connects a server (kept for the servers a reload adds)."""

    secrets: SecretResolver | None
    tuning: Tuning | None
    max_body: int
    egress: EgressPolicy | None


class McpPool:
    """The run's MCP servers behind one interface. (A plain class: this module loads at a once run's start-up,
    where an attrs class of this size costs a few milliseconds of CPU to build.)"""

    # __weakref__: the loop keeps what it built from this pool's tools for as long as the pool lives
    __slots__ = ("__weakref__", "_nursery", "_opening", "_pending", "_pending_event", "_receive", "_retiring",
                 "_scopes", "_send", "_sink", "connections", "declared", "eras", "failed", "log", "run_id")

    def __init__(self, log: EventLog, run_id: str, declared: list[McpServerConfig] | None = None,
                 eras: EraCache | None = None) -> None:
        self.log = log
        self.run_id = run_id
        #: Connected servers, in declaration order.
        self.connections: dict[str, ServerConnection] = {}
        #: Servers that failed to connect (optional ones, or every one with ``raise_required=False``).
        self.failed: dict[str, AgentdError] = {}
        self.declared: list[McpServerConfig] = [] if declared is None else declared
        #: Origins known to be modern-only, shared by every connection of the pool (and, by default, the process).
        self.eras = process_era_cache() if eras is None else eras
        self._send: trio.MemorySendChannel[ResourceUpdated]
        self._receive: trio.MemoryReceiveChannel[ResourceUpdated]
        self._send, self._receive = trio.open_memory_channel["ResourceUpdated"](0)
        self._pending: dict[tuple[str, str], ResourceUpdated] = {}
        self._pending_event = trio.Event()
        self._sink: Delivery | None = None
        #: The nursery every connection runs in, each under its own scope (a reload closes one by one).
        self._nursery: trio.Nursery | None = None
        self._scopes: dict[ServerConnection, trio.CancelScope] = {}
        self._opening: _Opening | None = None
        #: Removed servers' connections while they retire: the turn in flight may still call them by name.
        self._retiring: dict[str, ServerConnection] = {}

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
        conn = self.connections.get(server) or self._retiring.get(server)
        if conn is None:
            known = ", ".join(self.connections) or "none"
            raise McpError(f"no connected MCP server named {server!r} (connected: {known})", server=server)
        return conn

    async def call_tool(
        self, server: str, tool: str, arguments: Mapping[str, Any] | None = None, *, run_id: str | None = None,
        idempotency_key: str | None = None, resume_task: str | None = None, on_task: TaskStarted | None = None,
    ) -> ToolResult:
        """Call a tool. ``isError`` comes back as a result; JSON-RPC errors raise McpRpcError.

        ``idempotency_key`` names the logical call (the loop derives it: agentd.formats.ids.call_key); without one the
        call gets a fresh key of its own. A call the server runs as a task reports the task's id to ``on_task``;
        ``resume_task`` polls a task such a call started before instead of calling the tool
        (ServerConnection.call_tool)."""
        return await self._connection(server).call_tool(
            tool, dict(arguments or {}), run_id=run_id if run_id is not None else self.run_id,
            idempotency_key=idempotency_key if idempotency_key is not None else new_call_key(),
            resume_task=resume_task, on_task=on_task,
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

    def deliver(self, sink: Delivery | None) -> None:
        """Hand every update to ``sink(uri, server)`` on the connection's own task as it arrives, instead of
        through :meth:`updates` (None: back to the channel).

        A wake's latency budget is milliseconds and a channel costs its consumer a scheduling round per
        update; a consumer that only routes (agentd.modes.watch.Watcher) takes them directly. ``sink``
        must return at once and never raise: it runs inside the connection's notification handling.
        """
        self._sink = sink

    def _on_update(self, server: str, uri: str, synthesized: bool) -> None:
        from agentd.client.models import ResourceUpdated  # loaded with the first server's connection already

        if self._sink is not None:
            self._sink(uri, server)
            return
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
        *,
        into: StagedServers | None = None,
        owned: bool = False,
    ) -> None:
        """Connect one server into the pool (or into ``into``); ``owned``: the connection closes ``client``."""
        import httpx

        from agentd.client.connection import ServerConnection
        from agentd.transport.http_client import HttpTransport

        connections, failed = (self.connections, self.failed) if into is None else (into.connections, into.failed)
        try:
            headers = secrets.resolve_headers(config.headers) if secrets is not None else dict(config.headers)
        except AgentdError as exc:
            failed[config.name] = self._fail(config, McpConnectError(f"MCP server {config.name!r}: {exc}",
                                                                     server=config.name))
            if owned:
                await _close_client(client)
            return
        auth = config.auth if isinstance(config.auth, httpx.Auth) else None
        if auth is None and config.credentials is not None:
            try:
                auth = _credential_auth(config, self.log)
            except McpConnectError as exc:
                failed[config.name] = self._fail(config, exc)
                if owned:
                    await _close_client(client)
                return
        conn = ServerConnection(
            config,
            HttpTransport(
                client, config.url, server=config.name, max_body=max_body,
                auth=auth,
            ),
            self.log,
            self._on_update,
            extra_headers=headers,
            tuning=tuning,
            rng=random.Random(),
            eras=self.eras,
        )
        self._scopes[conn] = scope = trio.CancelScope()
        try:
            await nursery.start(self._serve_one, conn, scope, client if owned else None)
        except McpConnectError as exc:
            failed[config.name] = self._fail(config, exc)
            return
        connections[config.name] = conn

    async def _serve_one(self, conn: ServerConnection, scope: trio.CancelScope, client: httpx.AsyncClient | None,
                         *, task_status: trio.TaskStatus[ServerConnection]) -> None:
        """One connection's life, under its own scope; then the client it owns closes (shielded, bounded)."""
        try:
            with scope:
                await conn.serve(task_status=task_status)
        finally:
            self._scopes.pop(conn, None)
            if client is not None:
                await _close_client(client)

    def _fail(self, config: McpServerConfig, exc: McpConnectError) -> McpConnectError:
        from agentd.transport.http_client import display_url

        self.log.emit(
            "mcp.connect_failed", "error" if config.required else "warn",
            server=config.name, url=display_url(config.url), required=config.required, error=str(exc),
        )  # fmt: skip
        return exc

    def _order(self) -> None:
        self.connections = {c.name: self.connections[c.name] for c in self.declared if c.name in self.connections}

    # -- reloading ---------------------------------------------------------------------------------------

    async def stage(self, servers: Sequence[McpServerConfig]) -> StagedServers:
        """Connect the servers ``servers`` adds or changes, beside the running connections (nothing else changes).

        Raises:
            McpConnectError: a required added or changed server failed its handshake (what was staged is
                closed again; the pool is as it was).
        """
        assert self._nursery is not None, "stage() needs an open pool"
        assert self._opening is not None
        from agentd.client._streams import Tuning
        from agentd.transport.http_client import new_client
        from agentd.transport.tls import verify_for

        opening, nursery = self._opening, self._nursery
        staged = StagedServers(list(servers), server_changes(self.declared, servers))
        wanted = set(staged.changes.added + staged.changes.changed)
        async with trio.open_nursery() as connecting:
            for config in servers:
                if config.name not in wanted:
                    continue
                if _own_client(config):
                    client = _client_for(config, None, opening.egress)
                    if isinstance(client, McpConnectError):
                        staged.failed[config.name] = self._fail(config, client)
                        continue
                else:  # its own client, closed with it: the running servers' shared one may lack its CA
                    client = new_client(verify=verify_for([config.url]), egress=opening.egress)
                connecting.start_soon(functools.partial(
                    self._start_one, nursery, config, client, opening.secrets, opening.tuning or Tuning(), opening.max_body,
                    into=staged, owned=True))
        failure = _required_failure(staged.declared, staged.failed)
        if failure is not None:
            self.discard(staged)
            raise failure
        return staged

    def discard(self, staged: StagedServers) -> None:
        """Close what :meth:`stage` connected (a reload that does not go ahead)."""
        for conn in staged.connections.values():
            self._close(conn)
        staged.connections.clear()

    async def commit(self, staged: StagedServers, turns_passed: TurnsPassed | None = None) -> list[tuple[str, str]]:
        """Swap the staged connections in; retire the ones they replace and the removed ones: each closes once
        ``turns_passed()`` returned (the turns in flight ended; a removed server stays callable by name until
        then) and no call is in flight on it, within :data:`RETIRE_WAIT`.

        A replaced server's watched URIs are subscribed again on its new connection (with one synthesized
        update each, so a change during the swap is not lost). Returns the ``(server, uri)`` subscriptions
        that were dropped: a removed server's, and any its replacement could not take.
        """
        changes = staged.changes
        retired = {name: self.connections.pop(name) for name in changes.removed + changes.changed
                   if name in self.connections}
        for name in changes.removed + changes.changed:
            self.failed.pop(name, None)
        self.connections.update(staged.connections)
        self.failed.update(staged.failed)
        self.declared = list(staged.declared)
        self._order()
        dropped: list[tuple[str, str]] = []
        for name, old in retired.items():
            new = self.connections.get(name)
            for uri in list(old.watched):
                if new is not None and await self._resubscribe(new, uri):
                    continue
                dropped.append((name, uri))
                self.log.warn("mcp.subscribe", server=name, uri=uri, action="dropped",
                              reason="the server was removed by a reload" if new is None
                              else "its new connection did not take the subscription")
            if new is None:
                self._retiring[name] = old
            assert self._nursery is not None
            self._nursery.start_soon(self._retire, old, turns_passed)
        return dropped

    async def _resubscribe(self, conn: ServerConnection, uri: str) -> bool:
        try:
            pushed = await conn.subscribe(uri)
        except McpError as exc:
            self.log.warn("mcp.subscribe_degraded", server=conn.name, uri=uri, error=str(exc))
            return False
        if pushed:
            conn.subscriptions.updated(uri, synthesized=True)
        return pushed

    async def _retire(self, conn: ServerConnection, turns_passed: TurnsPassed | None) -> None:
        """Let the turns and calls in flight on ``conn`` finish (within :data:`RETIRE_WAIT`), then close it."""
        with trio.move_on_after(RETIRE_WAIT):
            if turns_passed is not None:
                await turns_passed()
            await conn.exchange.wait_idle()
        if self._retiring.get(conn.name) is conn:
            del self._retiring[conn.name]
        self._close(conn)

    def _close(self, conn: ServerConnection) -> None:
        scope = self._scopes.get(conn)
        if scope is not None:
            scope.cancel()  # the connection's own cleanup (DELETE, client close) is shielded and bounded


def _required_failure(declared: Sequence[McpServerConfig], failed: Mapping[str, AgentdError]
                      ) -> McpConnectError | None:
    return next((exc for c in declared if c.required and isinstance(exc := failed.get(c.name), McpConnectError)),
                None)


async def _close_client(client: httpx.AsyncClient) -> None:
    from agentd.client.exchange import CLEANUP_GRACE

    with trio.move_on_after(CLEANUP_GRACE, shield=True):
        await client.aclose()


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


def _credential_auth(config: McpServerConfig, log: EventLog) -> httpx.Auth:
    """The per-request auth the installed credential source builds for ``config`` (agentd.client.credentials)."""
    from agentd.client.credentials import current_credentials

    source = current_credentials()
    if source is None:
        assert config.credentials is not None
        raise McpConnectError(
            f"MCP server {config.name!r}: auth type {config.credentials.type} needs agentd's credential source, "
            "which this process does not have (a library caller passes McpServerConfig.auth)", server=config.name)
    return source.auth_for(config, log)


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
            pool._nursery = nursery
            pool._opening = _Opening(secrets, tuning, max_body, egress)
            nursery.start_soon(pool._forward_updates)
            async with trio.open_nursery() as connecting:
                for config in declared:
                    client = _client_for(config, shared, egress)
                    if isinstance(client, McpConnectError):
                        pool.failed[config.name] = pool._fail(config, client)
                        continue
                    if client is not shared:
                        await stack.enter_async_context(client)
                    connecting.start_soon(
                        pool._start_one, nursery, config, client, secrets, tuning or Tuning(), max_body
                    )
            pool._order()
            if raise_required:
                failure = _required_failure(declared, pool.failed)
            if failure is not None:
                nursery.cancel_scope.cancel()
            else:
                def connected() -> bool:  # readiness: every required server (as declared now) is connected
                    return all(c.name in pool.connections and pool.connections[c.name].connected
                               for c in pool.declared if c.required)

                try:
                    with readiness_check(connected):
                        yield pool
                finally:
                    nursery.cancel_scope.cancel()
        # A consumer still reading updates() sees the end of the channel instead of waiting forever.
        pool._send.close()
    if failure is not None:
        raise failure
