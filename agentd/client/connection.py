"""One connection to one declared MCP server, over Streamable HTTP, in either protocol era.

Theory of operation. :meth:`ServerConnection.serve` runs in the pool's nursery for the pool's lifetime.
It connects (handshake, catalogue), reports itself started, then alternates two phases:

* **live**: a nursery holding what the era needs: on the legacy wire the standing GET stream (when the
  server can push anything), the pinger and the catalogue refresher; on the modern wire one
  ``subscriptions/listen`` stream, the pinger (``server/discover`` when idle: that wire has no ``ping``) and
  the refresher. Any of them (or a request that finds the transport
  gone, or a 404 on the session) marks the connection *broken*, which cancels the live nursery;
* **reconnect**: jittered exponential backoff until a new handshake succeeds, then every watched URI is
  re-subscribed and exactly one synthesized ``updated`` per URI is delivered, so a change missed while
  disconnected is not lost.

The connection owns its pieces, each with one job, and wires them together here:

* :class:`~agentd.client.exchange.Exchange`: requests out, messages in (the sans-io session lives there);
* :func:`~agentd.client.handshake.handshake`: the era probe, whose :class:`~agentd.client.handshake.Handshake`
  result says what the server told about itself;
* :class:`~agentd.client.catalogue.Catalogue`: tools, resources, templates, kept current;
* :class:`~agentd.client.subscriptions.Subscriptions`: the watched URIs and their updates;
* :class:`~agentd.client._streams.PushStreams`: the GET stream, the pinger, the listen loop;
* :class:`~agentd.client.liveness.Liveness`: connected or broken, and which generation.

Requests (:meth:`call_tool`, :meth:`read_resource`, ...) run in their callers' tasks.
"""

from __future__ import annotations

import random
from typing import Any

import attrs
import trio

from agentd import defaults
from agentd._version import __version__
from agentd.client._streams import PushStreams, Tuning, backoff_delay
from agentd.client.catalogue import Catalogue
from agentd.client.era_cache import EraCache
from agentd.client.exchange import CLEANUP_GRACE, Exchange, SessionGone
from agentd.client.handshake import Handshake, close_session, connect_error, handshake
from agentd.client.liveness import Liveness
from agentd.client.models import ResourceContents, ResourceInfo, ResourceTemplateInfo, ToolInfo, ToolResult
from agentd.client.subscriptions import Subscriptions, UpdateSink
from agentd.client.tasks import TaskStarted, TaskWait
from agentd.config.model import McpServerConfig
from agentd.errors import McpConnectError, McpError, McpProtocolError, McpRpcError, McpTransportError
from agentd.mcp import jsonrpc, types
from agentd.mcp import meta as mcp_meta
from agentd.mcp import tasks as mcp_tasks
from agentd.mcp.client_session import ClientSession, ResultTypeError
from agentd.mcp.streamable_http import param_headers
from agentd.mcp.versions import Era
from agentd.telemetry.events import EventLog
from agentd.transport.http_client import HttpTransport


@attrs.define(eq=False)
class ServerConnection:
    """One declared server: lifecycle and calls; the rest is delegated to the pieces it owns."""

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
    liveness: Liveness = attrs.field(init=False, factory=Liveness)
    exchange: Exchange = attrs.field(init=False)
    catalogue: Catalogue = attrs.field(init=False)
    subscriptions: Subscriptions = attrs.field(init=False)
    streams: PushStreams = attrs.field(init=False)
    #: What the last completed handshake learnt (None before the first).
    greeting: Handshake | None = attrs.field(init=False, default=None)
    _started: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self.session.declared = tuple(self.config.capabilities)  # the host's opt-in (docs/mcp-client.md)
        self.exchange = Exchange(
            self.config.name, self.transport, self.session, self.log, self.liveness, self._on_notification,
            reconnect_wait=self.config.connect_timeout + self.tuning.backoff_initial,
            extra_headers=self.extra_headers,
        )  # fmt: skip
        self.catalogue = Catalogue(self.config, self.exchange, self.log)
        self.subscriptions = Subscriptions(self.config, self.exchange, self.log, self.on_update)
        self.streams = PushStreams(
            self.config, self.exchange, self.liveness, self.subscriptions, self.log, self.tuning, self.rng
        )

    # -- what the rest of agentd reads ---------------------------------------------------------------------

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

    @property
    def session_id(self) -> str | None:
        return self.exchange.session_id

    @property
    def server_info(self) -> types.Implementation | None:
        return self.greeting.server_info if self.greeting is not None else None

    @property
    def instructions(self) -> str | None:
        return self.greeting.instructions if self.greeting is not None else None

    @property
    def tools(self) -> list[ToolInfo]:
        return self.catalogue.tools

    @property
    def resources(self) -> list[ResourceInfo]:
        return self.catalogue.resources

    @property
    def templates(self) -> list[ResourceTemplateInfo]:
        return self.catalogue.templates

    @property
    def watched(self) -> dict[str, None]:
        return self.subscriptions.watched

    @property
    def connected(self) -> bool:
        return self.liveness.connected

    @property
    def generation(self) -> int:
        return self.liveness.generation

    @property
    def stream_offered(self) -> bool | None:
        return self.streams.stream_offered

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
                self.liveness.down()
                self.log.warn("mcp.disconnected", server=self.name, reason=self.liveness.broken_reason)
                await self._reconnect()
                after_reconnect = True
        finally:
            # Refuse new requests, let the cancelled ones send their notifications/cancelled (their tasks
            # are cancelled along with this one, in no set order), only then forget and DELETE the session.
            self.exchange.closing = True
            with trio.move_on_after(CLEANUP_GRACE, shield=True):
                await self.exchange.wait_idle()
            self.liveness.down()
            with trio.move_on_after(CLEANUP_GRACE, shield=True):
                await close_session(self.exchange, self.log)

    async def _connect(self) -> None:
        self.exchange.reset()
        self.streams.stream_offered = None
        self.liveness.connecting()
        self.log.info("mcp.connect", server=self.name, url=self.transport.display_url)
        step = "no completed handshake"
        try:
            with trio.fail_after(self.config.connect_timeout):
                self.greeting = await handshake(self.exchange, self.eras, self.log, self.config.era)
            step = "the tools and resources lists did not complete"
            with trio.fail_after(self.config.connect_timeout):
                await self.catalogue.load()
        except trio.TooSlowError:
            raise connect_error(self.exchange, f"{step} within {self.config.connect_timeout:g} s") from None
        except McpConnectError:
            raise
        except SessionGone:
            raise connect_error(
                self.exchange, "the server answered 404 for the session it had just issued"
            ) from None
        except McpError as exc:
            hint = await self._tls_refusal(exc)
            raise connect_error(self.exchange, str(exc) + (f" ({hint})" if hint else "")) from exc
        self.exchange.activity = trio.current_time()
        self.liveness.up()
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

    async def _tls_refusal(self, exc: McpError) -> str | None:
        """An https connection that broke with no reason given: did the server refuse agentd as a TLS client
        (a client certificate missing or untrusted)? One bounded probe, on this failure path only."""
        from agentd.transport.http_client import ConnectionLost

        config = self.config
        if not isinstance(exc, ConnectionLost) or "certificate verify failed" in str(exc) or callable(
            config.http_client
        ) or not config.url.startswith("https://"):
            return None
        from urllib.parse import urlsplit

        from agentd.transport.tls import default_context
        from agentd.transport.tls_errors import probe_client_refusal

        tls = config.tls
        sent_cert = bool(tls is not None and tls.cert)
        try:
            if tls is not None and (tls.ca or tls.cert):
                from agentd.transport.http_client import tls_context

                context = tls_context(tls.ca, tls.cert, tls.key)
            else:
                context = default_context()
        except (OSError, ValueError):
            return None
        target = urlsplit(config.url)
        return await probe_client_refusal(target.hostname or "", target.port or 443, context, sent_cert=sent_cert)

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
                if self.streams.wants_get():
                    await live.start(self.streams.get_stream)
                if after_reconnect:
                    await self.subscriptions.resubscribe()
                live.start_soon(self.streams.pinger)
            else:
                await live.start(self.streams.listen_loop)
                live.start_soon(self.streams.pinger)  # server/discover when idle: the wire has no ping
            live.start_soon(self.catalogue.refresher)
            if task_status is not None:
                self._started = True
                task_status.started(self)
            if after_reconnect:
                self.subscriptions.synthesize()

    async def _watch_broken(self, scope: trio.CancelScope) -> None:
        await self.liveness.broken.wait()
        scope.cancel()

    async def wait_reconnected(self, generation: int) -> None:
        """Wait until a connection newer than ``generation`` is up (the caller bounds the wait)."""
        await self.liveness.wait_reconnected(generation)

    def _on_notification(self, method: str, params: dict[str, Any]) -> None:
        """Route what the exchange cannot settle itself: updates to subscriptions, list changes to the catalogue."""
        if method == "notifications/resources/updated":
            uri = params.get("uri")
            if isinstance(uri, str):
                self.subscriptions.updated(uri)
        elif method == "notifications/tools/list_changed":
            self.catalogue.want_refresh("tools", advertised=self.session.tools_list_changed())
        elif method == "notifications/resources/list_changed":
            self.catalogue.want_refresh("resources", advertised=self.session.resources_list_changed())
        elif method in mcp_tasks.STATUS_NOTIFICATIONS:
            self.subscriptions.task_status(params)

    # -- operations --------------------------------------------------------------------------------------

    async def call_tool(self, tool: str, arguments: dict[str, Any], *, run_id: str, idempotency_key: str,
                        resume_task: str | None = None, on_task: TaskStarted | None = None) -> ToolResult:
        """Call ``tool``. ``idempotency_key`` names this logical call: every send of it (the re-sends below, a
        resumed run's re-send) carries the same key (agentd.formats.ids.call_key).

        A call the server runs as a task (agentd.mcp.tasks) is waited for here (agentd.client.tasks), within the
        same call timeout: ``on_task`` hears the task's id once it exists; ``resume_task`` (a journaled id) polls
        that task instead of calling the tool again."""
        if self.config.tools is not None and tool not in self.config.tools:
            raise McpError(f"tools/call {tool}: not in the host's allowlist for {self.name!r}", server=self.name)
        if tool in self.catalogue.refused:
            raise McpError(f"tools/call {tool}: refused, its listed definition does not match the pin for "
                           f"{self.name!r} (see mcp.tool_pin_mismatch)", server=self.name)
        info = self.catalogue.tool(tool)
        mode = mcp_tasks.call_mode(self.era, info.task_support if info is not None else "forbidden",
                                   self.capabilities)
        if resume_task is None and (mode is mcp_tasks.CallMode.UNUSABLE or tool in self.catalogue.unusable):
            raise McpError(f"tools/call {tool}: cannot be called: {mcp_tasks.unusable_reason()}", server=self.name)
        params = mcp_meta.tool_call_params(tool, arguments, run_id=run_id, key=idempotency_key,
                                           standard_field=self.session.tools_idempotency())
        if mode is mcp_tasks.CallMode.TASK:
            params = mcp_tasks.augment(params, round(defaults.TASK_TTL * 1000))
        try:
            with trio.fail_after(self.config.call_timeout):
                wait = TaskWait(self.exchange, self.log, self.name, tool, subscriptions=self.subscriptions)
                task: mcp_tasks.Task | None = None
                if resume_task is not None:
                    self.log.info("mcp.task_resumed", server=self.name, tool=tool, task_id=resume_task)
                    result = await wait.resume(resume_task)
                else:
                    result = await self._send_call(tool, arguments, params)
                    try:
                        task = mcp_tasks.created(result, self.era or Era.LEGACY)
                    except ResultTypeError as exc:
                        raise McpProtocolError(f"tools/call {tool}: {exc}", server=self.name) from None
                    # (a server that answered a task-augmented call plainly after all: that answer is the result)
                if task is not None:
                    result = await wait.run(task, on_started=on_task)
        except trio.TooSlowError:
            raise McpTransportError(
                f"tools/call {tool}: no answer within {self.config.call_timeout:g} s", server=self.name, timed_out=True
            ) from None
        try:
            parsed = types.structure(result, types.CallToolResult)
        except types.WireError as exc:
            raise McpProtocolError(f"tools/call {tool}: {exc}", server=self.name) from None
        if not parsed.is_error:
            self.catalogue.check_structured(tool, parsed.structured_content)
        return ToolResult(parsed.content, parsed.is_error, parsed.structured_content)

    async def _send_call(self, tool: str, arguments: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        exchange = self.exchange
        try:
            return await exchange.request("tools/call", params, headers=self._param_headers(tool, arguments),
                                          idempotent=self._idempotent(tool))
        except McpRpcError as exc:
            if self.era is not Era.MODERN or exc.code != jsonrpc.HEADER_MISMATCH:
                raise
            # -32020: our Mcp-Param-* headers disagree with the server's current schema. Re-list the
            # tools and retry once (2026-07-28).
            await self.catalogue.load_tools()
            return await exchange.request("tools/call", params, headers=self._param_headers(tool, arguments),
                                          idempotent=self._idempotent(tool))

    def _idempotent(self, tool: str) -> bool:
        """The tool's ``idempotentHint`` (server text, but only ever used to allow a re-send of a call that
        never reached the server: agentd.mcp.failure_policy)."""
        info = self.catalogue.tool(tool)
        return info is not None and isinstance(info.annotations, dict) and info.annotations.get("idempotentHint") is True

    def _param_headers(self, tool: str, arguments: dict[str, Any]) -> dict[str, str] | None:
        if self.era is not Era.MODERN:
            return None
        info = self.catalogue.tool(tool)
        return param_headers(info.input_schema, arguments) if info is not None else None

    async def read_resource(self, uri: str) -> ResourceContents:
        try:
            with trio.fail_after(self.config.call_timeout):
                result = await self.exchange.request("resources/read", {"uri": uri})
        except trio.TooSlowError:
            raise McpTransportError(
                f"resources/read {uri}: no answer within {self.config.call_timeout:g} s", server=self.name,
                timed_out=True,
            ) from None
        try:
            parsed = types.structure(result, types.ReadResourceResult)
        except types.WireError as exc:
            raise McpProtocolError(f"resources/read {uri}: {exc}", server=self.name) from None
        return ResourceContents(self.name, uri, parsed.contents)

    def can_subscribe(self) -> bool:
        return self.subscriptions.can_subscribe()

    async def subscribe(self, uri: str) -> bool:
        """Watch ``uri``. False (and a ``mcp.subscribe_degraded`` event) when the server cannot push it."""
        return await self.subscriptions.subscribe(uri, stream_offered=self.streams.stream_offered)

    async def unsubscribe(self, uri: str) -> None:
        await self.subscriptions.unsubscribe(uri)
