"""One connection to one declared MCP server, over Streamable HTTP, in either protocol era.

Theory of operation. :meth:`ServerConnection.serve` runs in the pool's nursery for the pool's lifetime.
It connects (handshake, catalogue), reports itself started, then alternates two phases:

* **live**: a nursery holding what the era needs: on the legacy wire the standing GET stream (when the
  server can push anything), the pinger and the catalogue refresher; on the modern wire one
  ``subscriptions/listen`` stream and the refresher. Any of them (or a request that finds the transport
  gone, or a 404 on the session) marks the connection *broken*, which cancels the live nursery;
* **reconnect**: jittered exponential backoff until a new handshake succeeds, then every watched URI is
  re-subscribed and exactly one synthesized ``updated`` per URI is delivered, so a change missed while
  disconnected is not lost.

Requests (:meth:`call_tool`, :meth:`read_resource`, ...) run in their callers' tasks. Every message that
arrives on any stream goes through :meth:`_dispatch` and the sans-io :class:`ClientSession`, which
answers server requests and matches responses to waiting requests by id (so a response that arrives on
a resumed GET stream still finds its caller). A request abandoned by cancellation sends
``notifications/cancelled`` shielded and bounded (legacy) or just closes its response stream (modern).
"""


from __future__ import annotations

import random
from typing import Any

import attrs
import trio

from agentd._version import __version__
from agentd.client._streams import (
    CLEANUP_GRACE,
    StreamsMixin,
    Tuning,
    UpdateSink,
    _SessionGone,
    _Waiter,
    backoff_delay,
)
from agentd.client.catalogue import CatalogueMixin
from agentd.client.era_cache import EraCache
from agentd.client.exchange import ExchangeMixin
from agentd.client.handshake import HandshakeMixin
from agentd.client.handshake import _NotModern as _NotModern  # re-exported: its home used to be here
from agentd.client.models import ResourceContents, ResourceInfo, ResourceTemplateInfo, ToolInfo, ToolResult
from agentd.client.subscriptions import SubscriptionsMixin
from agentd.config.model import McpServerConfig
from agentd.errors import McpConnectError, McpError, McpProtocolError, McpRpcError, McpTransportError
from agentd.events import EventLog
from agentd.mcp import jsonrpc, schemas, types
from agentd.mcp import meta as mcp_meta
from agentd.mcp.client_session import ClientSession
from agentd.mcp.streamable_http import param_headers
from agentd.mcp.versions import Era
from agentd.transport.http_client import HttpTransport


@attrs.define(eq=False)
class ServerConnection(HandshakeMixin, ExchangeMixin, CatalogueMixin, SubscriptionsMixin, StreamsMixin):
    """One declared server. The era probe, request exchange, catalogue, subscriptions and push streams are
    its mixins (handshake, exchange, catalogue, subscriptions, _streams); lifecycle and calls live here."""

    config: McpServerConfig
    transport: HttpTransport
    log: EventLog
    on_update: UpdateSink
    extra_headers: dict[str, str] = attrs.field(factory=dict)
    tuning: Tuning = attrs.field(factory=Tuning)
    rng: random.Random = attrs.field(factory=random.Random)
    #: Origins known to be modern-only; the pool shares one (see agentd.client.era_cache).
    eras: EraCache = attrs.field(factory=EraCache)
    session: ClientSession = attrs.field(
        factory=lambda: ClientSession(types.Implementation(name="agentd", version=__version__))
    )
    session_id: str | None = None
    tools: list[ToolInfo] = attrs.field(factory=list)
    resources: list[ResourceInfo] = attrs.field(factory=list)
    templates: list[ResourceTemplateInfo] = attrs.field(factory=list)
    server_info: types.Implementation | None = None
    instructions: str | None = None
    ttl_ms: dict[str, int | None] = attrs.field(factory=dict)
    #: Watched URIs in subscription order (a dict as an ordered set).
    watched: dict[str, None] = attrs.field(factory=dict)
    connected: bool = False
    generation: int = 0
    stream_offered: bool | None = None
    _waiters: dict[jsonrpc.RequestId, _Waiter] = attrs.field(factory=dict)
    _broken: trio.Event = attrs.field(factory=trio.Event)
    _broken_reason: str = ""
    _started: bool = False
    _reconnected: trio.Event = attrs.field(factory=trio.Event)
    _activity: float = 0.0
    _refresh: set[str] = attrs.field(factory=set)
    _refresh_wanted: trio.Event = attrs.field(factory=trio.Event)
    _listen_changed: trio.Event = attrs.field(factory=trio.Event)
    _listen_dropped: bool = False
    _listen_ended: bool = False
    _listen_acks: int = 0
    _listen_acked: trio.Event = attrs.field(factory=trio.Event)
    #: URIs the current modern listen acknowledged.
    _acked: set[str] = attrs.field(factory=set)
    _validators: dict[str, Any] = attrs.field(factory=dict)
    #: Requests between POST and their abandon step; closing waits for them so a run cancelled as a whole
    #: still sends every ``notifications/cancelled`` before the session is deleted.
    _inflight: int = 0
    _idle: trio.Event = attrs.field(factory=trio.Event)
    _closing: bool = False

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def era(self) -> Era | None:
        return self.session.era

    @property
    def protocol_version(self) -> str | None:
        return self.session.protocol_version

    @property
    def capabilities(self) -> dict[str, Any]:
        return self.session.capabilities

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[ServerConnection] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, then keep the connection alive until cancelled. Raises McpConnectError before started."""
        try:
            await self._connect()
            status: trio.TaskStatus[ServerConnection] | None = task_status
            after_reconnect = False
            while True:
                # The first live phase reports the connection started once its streams are up.
                await self._run_live(after_reconnect=after_reconnect, task_status=status)
                if status is not None and not self._started:
                    status.started(self)
                status = None
                self.connected = False
                self.log.warn("mcp.disconnected", server=self.name, reason=self._broken_reason)
                await self._reconnect()
                after_reconnect = True
        finally:
            # Refuse new requests, let the cancelled ones send their notifications/cancelled (their tasks
            # are cancelled along with this one, in no set order), only then forget and DELETE the session.
            self._closing = True
            with trio.move_on_after(CLEANUP_GRACE, shield=True):
                while self._inflight:
                    await self._idle.wait()
            self.connected = False
            with trio.move_on_after(CLEANUP_GRACE, shield=True):
                await self._close_session()

    def _mark_broken(self, reason: str) -> None:
        if self.connected and not self._broken.is_set():
            self._broken_reason = reason
            self._broken.set()

    async def _connect(self) -> None:
        self.session.reset()
        self.session_id = None
        self.stream_offered = None
        self._broken = trio.Event()
        self.log.info("mcp.connect", server=self.name, url=self.transport.display_url)
        step = "no completed handshake"
        try:
            with trio.fail_after(self.config.connect_timeout):
                await self._handshake()
            step = "the tools and resources lists did not complete"
            with trio.fail_after(self.config.connect_timeout):
                await self._load_catalogue()
        except trio.TooSlowError:
            raise self._connect_error(f"{step} within {self.config.connect_timeout:g} s") from None
        except McpConnectError:
            raise
        except _SessionGone:
            raise self._connect_error("the server answered 404 for the session it had just issued") from None
        except McpError as exc:
            raise self._connect_error(str(exc)) from exc
        self.connected = True
        self.generation += 1
        self._activity = trio.current_time()
        self.log.info(
            "mcp.connected",
            server=self.name,
            era=self.era.value if self.era else None,
            protocol_version=self.protocol_version,
            server_info=types.unstructure(self.server_info) if self.server_info else None,
            capabilities=self.capabilities,
            tools=len(self.tools),
            resources=len(self.resources),
        )
        reconnected, self._reconnected = self._reconnected, trio.Event()
        reconnected.set()

    def _connect_error(self, what: str) -> McpConnectError:
        return McpConnectError(f"MCP server {self.name!r} ({self.transport.display_url}): {what}", server=self.name)

    async def _reconnect(self) -> None:
        attempt = 0
        while True:
            delay = backoff_delay(attempt, self.tuning, self.rng)
            self.log.info("mcp.reconnect", server=self.name, attempt=attempt + 1, delay=round(delay, 3))
            await trio.sleep(delay)
            attempt += 1
            try:
                await self._connect()
                return
            except McpConnectError as exc:
                self.log.warn("mcp.connect_failed", server=self.name, error=str(exc), attempt=attempt)

    async def _run_live(
        self, *, after_reconnect: bool, task_status: trio.TaskStatus[ServerConnection] | None = None
    ) -> None:
        async with trio.open_nursery() as live:
            live.start_soon(self._watch_broken, live.cancel_scope)
            if self.era is Era.LEGACY:
                if self._wants_stream():
                    await live.start(self._get_stream)
                if after_reconnect:
                    await self._resubscribe()
                live.start_soon(self._pinger)
            else:
                await live.start(self._listen_loop)
            live.start_soon(self._refresher)
            if task_status is not None:
                self._started = True
                task_status.started(self)
            if after_reconnect:
                for uri in self.watched:
                    self.log.info("mcp.updated", server=self.name, uri=uri, synthesized=True)
                    self.on_update(self.name, uri, True)

    async def _watch_broken(self, scope: trio.CancelScope) -> None:
        await self._broken.wait()
        scope.cancel()

    def _wants_stream(self) -> bool:
        s = self.session
        return s.tools_list_changed() or s.resources_list_changed() or s.can_subscribe()

    async def wait_reconnected(self, generation: int) -> None:
        """Wait until a connection newer than ``generation`` is up (the caller bounds the wait)."""
        while self.generation <= generation or not self.connected:
            await self._reconnected.wait()

    # -- operations --------------------------------------------------------------------------------------

    async def call_tool(self, tool: str, arguments: dict[str, Any], *, run_id: str) -> ToolResult:
        if self.config.tools is not None and tool not in self.config.tools:
            raise McpError(f"tools/call {tool}: not in the host's allowlist for {self.name!r}", server=self.name)
        params: dict[str, Any] = {"name": tool, "arguments": arguments, "_meta": {mcp_meta.RUN_ID: run_id}}
        try:
            with trio.fail_after(self.config.call_timeout):
                try:
                    result = await self.request("tools/call", params, headers=self._param_headers(tool, arguments))
                except McpRpcError as exc:
                    if self.era is not Era.MODERN or exc.code != jsonrpc.HEADER_MISMATCH:
                        raise
                    # -32020: our Mcp-Param-* headers disagree with the server's current schema. Re-list the
                    # tools and retry once (2026-07-28).
                    await self._load_tools()
                    result = await self.request("tools/call", params, headers=self._param_headers(tool, arguments))
        except trio.TooSlowError:
            raise McpTransportError(
                f"tools/call {tool}: no answer within {self.config.call_timeout:g} s", server=self.name
            ) from None
        try:
            parsed = types.structure(result, types.CallToolResult)
        except types.WireError as exc:
            raise McpProtocolError(f"tools/call {tool}: {exc}", server=self.name) from None
        if not parsed.is_error:
            self._check_structured(tool, parsed.structured_content)
        return ToolResult(parsed.content, parsed.is_error, parsed.structured_content)

    def _param_headers(self, tool: str, arguments: dict[str, Any]) -> dict[str, str] | None:
        if self.era is not Era.MODERN:
            return None
        info = next((t for t in self.tools if t.name == tool), None)
        return param_headers(info.input_schema, arguments) if info is not None else None

    def _check_structured(self, tool: str, structured: dict[str, Any] | None) -> None:
        info = next((t for t in self.tools if t.name == tool), None)
        if info is None or info.output_schema is None:
            return
        if structured is None:
            raise McpProtocolError(
                f"tools/call {tool}: the tool declares an outputSchema but returned no structuredContent",
                server=self.name,
            )
        validator = self._validators.get(tool)
        if validator is None:
            compiled = schemas.compile_schema(info.output_schema)
            if compiled.validator is None:
                why = compiled.error or compiled.unusable
                self.log.warn("mcp.protocol_error", server=self.name, what=f"{tool}: invalid outputSchema: {why}")
                return
            validator = self._validators[tool] = compiled.validator
        try:
            error = schemas.first_error(validator, structured)
        except schemas.SchemaUnusable as exc:
            self.log.warn("mcp.protocol_error", server=self.name, what=f"{tool}: invalid outputSchema: {exc}")
            return
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise McpProtocolError(
                f"tools/call {tool}: structuredContent does not match the outputSchema at {where}: {error.message}",
                server=self.name,
            )

    async def read_resource(self, uri: str) -> ResourceContents:
        try:
            with trio.fail_after(self.config.call_timeout):
                result = await self.request("resources/read", {"uri": uri})
        except trio.TooSlowError:
            raise McpTransportError(
                f"resources/read {uri}: no answer within {self.config.call_timeout:g} s", server=self.name
            ) from None
        try:
            parsed = types.structure(result, types.ReadResourceResult)
        except types.WireError as exc:
            raise McpProtocolError(f"resources/read {uri}: {exc}", server=self.name) from None
        return ResourceContents(self.name, uri, parsed.contents)
