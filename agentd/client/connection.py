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
import jsonschema
import trio

from agentd._version import __version__
from agentd.client._streams import (
    CLEANUP_GRACE,
    DEFAULT_RETRY,
    MAX_PAGES,
    RESUME_ATTEMPTS,
    STREAM_DRAIN_GRACE,
    StreamsMixin,
    Tuning,
    UpdateSink,
    _SessionGone,
    _StreamBroke,
    _Waiter,
    backoff_delay,
)
from agentd.client.era_cache import EraCache
from agentd.client.errors import ResponseStreamBroken
from agentd.client.models import ResourceContents, ResourceInfo, ResourceTemplateInfo, ToolInfo, ToolResult
from agentd.config.model import McpServerConfig
from agentd.errors import (
    McpConnectError,
    McpError,
    McpProtocolError,
    McpRpcError,
    McpTransportError,
    ResourceNotFound,
)
from agentd.events import EventLog
from agentd.mcp import jsonrpc, types
from agentd.mcp import meta as mcp_meta
from agentd.mcp.client_session import (
    CapabilityMissing,
    ClientSession,
    ErrorReceived,
    HandshakeError,
    NotificationReceived,
    ResponseReceived,
    ResultTypeError,
    ServerRequestAnswered,
    SessionError,
    State,
    result_type,
)
from agentd.mcp.streamable_http import (
    LAST_EVENT_ID,
    SESSION_ID,
    Body,
    invalid_header_annotation,
    param_headers,
    reissue_safe,
    request_headers,
    valid_session_id,
)
from agentd.mcp.versions import LATEST_MODERN, Era
from agentd.transport.http_client import ConnectionLost, HttpReply, HttpTransport


class _NotModern(Exception):
    """A cached modern-only verdict did not hold: probe again with ``initialize``."""


@attrs.define(eq=False)
class ServerConnection(StreamsMixin):
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

    async def _handshake(self) -> None:
        if self.eras.modern(self.transport.url) is not None:
            # The origin is known to be modern-only (this connection or an earlier one in the process learnt
            # it): skip the refused initialize. If discover says otherwise, the entry is dropped and we probe.
            try:
                await self._discover(None)
                return
            except _NotModern:
                self.session.reset()
        request = self.session.start_initialize()
        try:
            result = await self._exchange(request)
        except McpRpcError as exc:
            refusal = jsonrpc.ErrorResponse(None, exc.code, exc.rpc_message, exc.data)
            if self.session.modern_refusal(refusal):
                await self._discover(exc)
                return
            raise self._connect_error(f"initialize was refused: {exc}") from None
        try:
            init = self.session.complete_initialize(result)
        except HandshakeError as exc:
            raise self._connect_error(str(exc)) from None
        self.server_info = init.server_info
        self.instructions = init.instructions
        self.log.info("mcp.era", server=self.name, era="legacy", protocol_version=init.protocol_version)
        await self._post(self.session.initialized_notification())

    async def _discover(self, refusal: McpRpcError | None) -> None:
        """Switch to the modern wire: the server refused ``initialize`` the way a 2026-07-28 server does, or
        (``refusal`` None) the era cache says its origin is modern-only.

        Raises:
            _NotModern: the cached verdict did not hold (the entry is dropped; probe with initialize).
            McpConnectError: anything else.
        """
        failure: McpError | HandshakeError
        for attempt in range(2):
            request = self.session.start_discover()
            try:
                result = await self._exchange(request)
                found = self.session.adopt_modern(result)
                break
            except _StreamBroke as exc:
                if attempt == 0:
                    self.log.warn("mcp.stream", server=self.name, method=request.method, reissued=True,
                                  request_id=request.id, error=exc.detail)  # fmt: skip
                    continue
                failure = self._stream_broken(request.method, exc, reissued=True)
            except (McpError, HandshakeError) as exc:
                failure = exc
            # A network failure (refused, reset, broken twice) is no verdict about the era.
            no_verdict = isinstance(failure, ConnectionLost | ResponseStreamBroken)
            if refusal is None and not no_verdict:
                if self.eras.forget(self.transport.url):
                    self.log.info("mcp.era", server=self.name, era=None, cache="dropped", error=str(failure))
                raise _NotModern()
            if refusal is None:
                raise self._connect_error(f"server/discover failed ({failure})") from None
            raise self._connect_error(
                f"initialize was refused ({refusal}) and server/discover failed too ({failure})"
            ) from None
        assert self.protocol_version is not None
        self.eras.record_modern(self.transport.url, self.protocol_version)
        meta = found.extra.get("_meta")
        info = (meta.get(mcp_meta.SERVER_INFO) if isinstance(meta, dict) else None) or found.extra.get("serverInfo")
        try:
            self.server_info = types.structure(info, types.Implementation) if info else None
        except types.WireError:
            self.server_info = None
        self.instructions = found.instructions
        self.ttl_ms["server/discover"] = found.ttl_ms
        self.log.info("mcp.era", server=self.name, era="modern", protocol_version=self.protocol_version,
                      cached=refusal is None)  # fmt: skip

    async def _close_session(self) -> None:
        """DELETE the legacy session on an orderly close (a 405 just means the server keeps no sessions)."""
        if self.era is Era.LEGACY and self.session_id is not None:
            headers = self._headers(None, get=True)
            try:
                await self.transport.delete(headers)
            except McpError:
                pass
            self.log.info("mcp.closed", server=self.name)
        self.session_id = None

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

    # -- requests ----------------------------------------------------------------------------------------

    def _headers(self, request: jsonrpc.Request | None, *, get: bool = False) -> dict[str, str]:
        headers = dict(self.extra_headers)
        if request is not None and request.method == "server/discover":
            era: Era | None = Era.MODERN
            version: str | None = LATEST_MODERN
        else:
            era = self.session.era
            version = self.session.protocol_version if self.session.state is State.READY else None
        headers.update(
            request_headers(
                era=era,
                protocol_version=version,
                session_id=self.session_id,
                method=request.method if request is not None else None,
                params=request.params if request is not None else None,
                get=get,
            )
        )
        return headers

    async def request(
        self, method: str, params: dict[str, Any] | None = None, *, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """One request on the live session; a 404 on the session re-initializes and retries once."""
        if self._closing:
            raise McpTransportError(f"MCP server {self.name!r}: the connection is closing", server=self.name)
        if not self.connected:
            raise McpTransportError(f"MCP server {self.name!r} is not connected (reconnecting)", server=self.name)
        generation = self.generation
        try:
            return await self._request_once(method, params, headers)
        except _SessionGone:
            self._mark_broken("the server forgot the session (404)")
        with trio.move_on_after(self.config.connect_timeout + self.tuning.backoff_initial) as waiting:
            await self.wait_reconnected(generation)
        if waiting.cancelled_caught:
            raise McpTransportError(
                f"{method}: the server forgot the session (404) and no new one came up in time", server=self.name
            )
        try:
            return await self._request_once(method, params, headers)
        except _SessionGone:
            raise McpTransportError(f"{method}: the server forgot the session twice", server=self.name) from None

    async def _request_once(
        self, method: str, params: dict[str, Any] | None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """One request (no 404 recovery). On the modern wire a response stream that breaks before the answer
        is re-issued once under a new id when the method is side-effect free, else surfaced typed."""
        try:
            return await self._request_attempt(method, params, headers)
        except _StreamBroke as exc:
            if not reissue_safe(method):
                raise self._stream_broken(method, exc, reissued=False) from None
            self.log.warn("mcp.stream", server=self.name, method=method, reissued=True, request_id=exc.request_id,
                          error=exc.detail)  # fmt: skip
        try:
            return await self._request_attempt(method, params, headers)
        except _StreamBroke as exc:
            raise self._stream_broken(method, exc, reissued=True) from None

    def _stream_broken(self, method: str, exc: _StreamBroke, *, reissued: bool) -> ResponseStreamBroken:
        if reissued:
            what = f"{method}: the response stream broke before the answer, again after re-issuing it under a new id"
        else:
            what = (f"{method}: the response stream broke before the answer; not re-sent, because the request may "
                    "not be idempotent (it may or may not have run)")  # fmt: skip
        return ResponseStreamBroken(f"{what} ({exc.detail})", server=self.name, method=method,
                                    request_id=exc.request_id, reissued=reissued)  # fmt: skip

    async def _request_attempt(
        self, method: str, params: dict[str, Any] | None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        try:
            request = self.session.request(method, params)
        except CapabilityMissing:
            raise
        except SessionError as exc:
            raise McpError(f"{method}: {exc}", server=self.name) from None
        self._inflight += 1
        try:
            result = await self._exchange(request, headers)
        except trio.Cancelled:
            await self._abandon(request, "the request was cancelled")
            raise
        except ConnectionLost as exc:
            self._mark_broken(str(exc))
            raise
        finally:
            self.session.pending.pop(request.id, None)  # answered, failed or abandoned: forget it
            self._inflight -= 1
            if not self._inflight:
                idle, self._idle = self._idle, trio.Event()
                idle.set()
        if self.era is Era.MODERN:
            try:
                result_type(result)
            except ResultTypeError as exc:
                raise McpProtocolError(f"{method}: {exc}", server=self.name) from None
        return result

    async def _abandon(self, request: jsonrpc.Request, reason: str) -> None:
        """Tell a legacy server we stopped waiting (never for initialize); shielded and bounded."""
        notification = self.session.cancel(request.id, reason)
        if notification is None or not self.connected:
            return
        with trio.move_on_after(CLEANUP_GRACE, shield=True):
            try:
                await self._post(notification)
            except (McpError, _SessionGone):
                pass
        self.log.info("mcp.cancelled", server=self.name, request_id=request.id, method=request.method)

    async def _exchange(self, request: jsonrpc.Request, extra: dict[str, str] | None = None) -> dict[str, Any]:
        """POST one request and pump replies until its answer arrives (resuming over GET if allowed)."""
        waiter = _Waiter()
        self._waiters[request.id] = waiter
        body = jsonrpc.dumps(request)
        headers = self._headers(request)
        if extra:
            headers.update(extra)
        resume: tuple[str | None, int | None] = (None, None)
        # 2026-07-28 has no resumability: a response that breaks before its answer is a _StreamBroke.
        modern = request.method == "server/discover" or self.session.era is Era.MODERN
        opened = False
        try:
            try:
                async with self.transport.open(
                    "POST", headers, body, had_session=self.session_id is not None
                ) as reply:
                    opened = True
                    if reply.kind is Body.SESSION_GONE:
                        raise _SessionGone()
                    if request.method == "initialize":
                        self._take_session_id(reply)
                    await self._pump(reply, waiter, request)
                    if reply.kind is Body.SSE and waiter.event.is_set():
                        await self._drain_stream(reply)
                    if reply.kind is Body.SSE and not waiter.event.is_set():
                        middle = reply.truncated()
                        if modern:
                            self.session.pending.pop(request.id, None)
                            where = "in the middle of an event" if middle else "before the answer"
                            raise _StreamBroke(f"the event stream ended {where}", request.id)
                        if middle:
                            raise McpProtocolError(
                                f"{request.method}: the event stream ended in the middle of an event",
                                server=self.name,
                            )
                        resume = (reply.last_event_id, reply.retry_ms)
            except ConnectionLost as exc:
                if modern and opened and not waiter.event.is_set():
                    # The connection broke mid-response, not before it: the request reached the server.
                    self.session.pending.pop(request.id, None)
                    raise _StreamBroke(str(exc), request.id) from None
                raise
            if not waiter.event.is_set() and resume[0] is not None and not modern:
                await self._resume(waiter, request, resume[0], resume[1])
        finally:
            self._waiters.pop(request.id, None)
        if waiter.error is not None:
            raise self._rpc_error(waiter.error, request)
        if waiter.result is None:
            self.session.pending.pop(request.id, None)
            raise McpTransportError(
                f"{request.method}: the response ended without an answer to request {request.id}", server=self.name
            )
        return waiter.result

    async def _pump(self, reply: HttpReply, waiter: _Waiter, request: jsonrpc.Request) -> None:
        if reply.kind is Body.HTTP_ERROR:
            error = await reply.error_body()
            if error is None:
                raise McpTransportError(f"{request.method}: HTTP {reply.status}", server=self.name)
            self.session.pending.pop(request.id, None)
            waiter.error = error
            waiter.event.set()
            return
        if reply.kind is Body.ACCEPTED:
            raise McpProtocolError(f"{request.method}: HTTP {reply.status} without a response", server=self.name)
        if reply.kind is Body.BAD_CONTENT_TYPE:
            raise McpProtocolError(
                f"{request.method}: unexpected content type {reply.header('content-type')!r}", server=self.name
            )
        while not waiter.event.is_set():
            message = await reply.receive()
            if message is None:
                return
            await self._dispatch(message)

    async def _drain_stream(self, reply: HttpReply) -> None:
        """Read the end of a POST's event stream after its answer (the server SHOULD close it right away).

        Reading to the end lets httpx reuse the connection; a server that keeps the stream open costs at
        most ``STREAM_DRAIN_GRACE`` and the connection.
        """
        with trio.move_on_after(STREAM_DRAIN_GRACE):
            try:
                while (message := await reply.receive()) is not None:
                    await self._dispatch(message)
            except McpError as exc:
                self.log.debug("mcp.protocol_error", server=self.name, what=f"after the answer: {exc}")

    async def _resume(self, waiter: _Waiter, request: jsonrpc.Request, last_id: str, retry_ms: int | None) -> None:
        """The SSE response closed before the answer: reconnect with GET + Last-Event-ID after ``retry``."""
        for _ in range(RESUME_ATTEMPTS):
            await trio.sleep(retry_ms / 1000 if retry_ms is not None else DEFAULT_RETRY)
            headers = self._headers(None, get=True)
            headers[LAST_EVENT_ID] = last_id
            async with self.transport.open("GET", headers, had_session=self.session_id is not None) as reply:
                if reply.kind is Body.SESSION_GONE:
                    raise _SessionGone()
                if reply.kind is not Body.SSE:
                    return
                await self._pump(reply, waiter, request)
                last_id = reply.last_event_id or last_id
                retry_ms = reply.retry_ms if reply.retry_ms is not None else retry_ms
            if waiter.event.is_set():
                return

    def _take_session_id(self, reply: HttpReply) -> None:
        value = reply.header(SESSION_ID)
        if value is None:
            return
        if not valid_session_id(value):
            raise McpProtocolError("the server issued a session id with invalid characters", server=self.name)
        self.session_id = value

    def _rpc_error(self, error: jsonrpc.ErrorResponse, request: jsonrpc.Request) -> McpRpcError:
        params = request.params or {}
        if request.method == "resources/read" and error.code in (jsonrpc.RESOURCE_NOT_FOUND, jsonrpc.INVALID_PARAMS):
            uri = error.data.get("uri") if isinstance(error.data, dict) else None
            return ResourceNotFound(
                uri if isinstance(uri, str) else str(params.get("uri")), error.code, error.message, error.data,
                server=self.name,
            )  # fmt: skip
        return McpRpcError(error.code, error.message, error.data, server=self.name, method=request.method)

    async def _post(self, message: jsonrpc.Message) -> None:
        """POST a notification or a response to a server request; expect 202."""
        headers = self._headers(message if isinstance(message, jsonrpc.Request) else None)
        if self.session.era is Era.MODERN and isinstance(message, jsonrpc.Notification):
            headers["Mcp-Method"] = message.method
        async with self.transport.open(
            "POST", headers, jsonrpc.dumps(message), had_session=self.session_id is not None
        ) as reply:
            if reply.kind is Body.SESSION_GONE:
                raise _SessionGone()
            if reply.kind not in (Body.ACCEPTED, Body.JSON, Body.SSE):
                self.log.warn("mcp.protocol_error", server=self.name, what=f"HTTP {reply.status} to a notification")

    async def _dispatch(self, message: jsonrpc.Message) -> None:
        self._activity = trio.current_time()
        event = self.session.receive(message)
        if isinstance(event, ResponseReceived | ErrorReceived):
            waiter = self._waiters.get(event.id)
            if waiter is not None:
                if isinstance(event, ResponseReceived):
                    waiter.result = event.result
                else:
                    waiter.error = event.error
                waiter.event.set()
        elif isinstance(event, ServerRequestAnswered):
            self.log.info("mcp.server_request", server=self.name, method=event.request.method)
            if self.session.era is not Era.MODERN:
                try:
                    await self._post(event.reply)
                except (McpError, _SessionGone) as exc:
                    self.log.warn("mcp.protocol_error", server=self.name, what=f"answering a server request: {exc}")
        elif isinstance(event, NotificationReceived):
            self._on_notification(event.method, event.params)
        else:
            self.log.debug("mcp.protocol_error", server=self.name, what="a response for no pending request")

    def _on_notification(self, method: str, params: dict[str, Any]) -> None:
        if method == "notifications/resources/updated":
            uri = params.get("uri")
            if isinstance(uri, str):
                self.log.info("mcp.updated", server=self.name, uri=uri, synthesized=False)
                self.on_update(self.name, uri, False)
        elif method == "notifications/tools/list_changed":
            self._want_refresh("tools", advertised=self.session.tools_list_changed())
        elif method == "notifications/resources/list_changed":
            self._want_refresh("resources", advertised=self.session.resources_list_changed())

    def _want_refresh(self, what: str, *, advertised: bool) -> None:
        self.log.info("mcp.list_changed", server=self.name, list=what, advertised=advertised)
        if advertised:
            self._refresh.add(what)
            self._refresh_wanted.set()

    # -- catalogue ---------------------------------------------------------------------------------------

    async def _load_catalogue(self) -> None:
        if self.session.has("tools") or self.era is Era.MODERN:
            await self._load_tools()
        else:
            self.tools = []
        if self.session.has("resources"):
            await self._load_resources()
        else:
            self.resources, self.templates = [], []

    async def _drain(self, method: str, key: str, cls: type[Any]) -> list[Any]:
        items: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            params = {"cursor": cursor} if cursor is not None else None
            result = await self._request_once(method, params)
            try:
                page = types.structure(result, cls)
            except types.WireError as exc:
                raise McpProtocolError(f"{method}: {exc}", server=self.name) from None
            items.extend(getattr(page, key))
            self.ttl_ms[method] = page.ttl_ms
            cursor = page.next_cursor
            if not cursor:
                return items
        raise McpProtocolError(
            f"{method}: still paging after {MAX_PAGES} pages (the server keeps returning a cursor)", server=self.name
        )

    async def _load_tools(self) -> None:
        tools: list[types.Tool] = await self._drain("tools/list", "tools", types.ListToolsResult)
        if self.era is Era.MODERN:
            # 2026-07-28: a tool whose x-mcp-header annotations are invalid MUST be dropped.
            kept = []
            for tool in tools:
                reason = invalid_header_annotation(tool.input_schema)
                if reason is None:
                    kept.append(tool)
                else:
                    self.log.warn("mcp.protocol_error", server=self.name, what=f"tool {tool.name!r} dropped: {reason}")
            tools = kept
        allowed = self.config.tools
        self.tools = [
            ToolInfo(self.name, t.name, t.description, t.input_schema, t.output_schema, t.annotations, t.title)
            for t in tools
            if allowed is None or t.name in allowed  # a host allowlist: the rest never reach the catalogue
        ]
        # The audit record of each (untrusted) description is the loop's mcp.tool_description event.
        self._validators = {}

    async def _load_resources(self) -> None:
        resources: list[types.Resource] = await self._drain(
            "resources/list", "resources", types.ListResourcesResult
        )
        self.resources = [
            ResourceInfo(self.name, r.uri, r.name, r.description, r.mime_type, r.size) for r in resources
        ]
        try:
            templates: list[types.ResourceTemplate] = await self._drain(
                "resources/templates/list", "resource_templates", types.ListResourceTemplatesResult
            )
        except McpRpcError as exc:
            self.log.debug("mcp.protocol_error", server=self.name, what=f"resources/templates/list: {exc}")
            templates = []
        self.templates = [
            ResourceTemplateInfo(self.name, t.uri_template, t.name, t.description, t.mime_type) for t in templates
        ]

    async def _refresher(self) -> None:
        """Re-list what a ``list_changed`` (or an expired modern ``ttlMs``) made stale."""
        while True:
            ttl = self.ttl_ms.get("tools/list") if self.era is Era.MODERN else None
            with trio.move_on_after(max(ttl / 1000, 1.0) if ttl else float("inf")) as expiry:
                await self._refresh_wanted.wait()
            if expiry.cancelled_caught:
                self._refresh.update({"tools", "resources"})
            self._refresh_wanted = trio.Event()
            wanted, self._refresh = self._refresh, set()
            try:
                with trio.fail_after(self.config.call_timeout):
                    if "tools" in wanted:
                        await self._load_tools()
                    if "resources" in wanted and self.session.has("resources"):
                        await self._load_resources()
            except (McpError, trio.TooSlowError, _SessionGone) as exc:
                self.log.warn("mcp.protocol_error", server=self.name, what=f"refreshing the catalogue: {exc}")
                continue
            self.log.info(
                "mcp.catalogue", server=self.name, tools=len(self.tools), resources=len(self.resources),
                refreshed=sorted(wanted),
            )  # fmt: skip

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
            try:
                jsonschema.Draft202012Validator.check_schema(info.output_schema)
            except jsonschema.SchemaError as exc:
                self.log.warn("mcp.protocol_error", server=self.name, what=f"{tool}: invalid outputSchema: {exc.message}")
                return
            validator = self._validators[tool] = jsonschema.Draft202012Validator(info.output_schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(structured))
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

    def can_subscribe(self) -> bool:
        return self.session.can_subscribe()

    async def subscribe(self, uri: str) -> bool:
        """Watch ``uri``. False (and a ``mcp.subscribe_degraded`` event) when the server cannot push it."""
        if uri in self.watched:
            return True
        if not self.session.can_subscribe():
            self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="no resources.subscribe")
            return False
        if self.era is Era.LEGACY and self.stream_offered is False:
            # resources/updated is not tied to a request: without the GET stream it has no way to us.
            self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="the server offers no GET stream")
            return False
        if self.era is Era.LEGACY and self.session_id is None:
            # A sessionless (stateless) server cannot tie a subscription to the stream that would carry it.
            self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="the server keeps no session")
            return False
        self.watched[uri] = None
        try:
            with trio.fail_after(self.config.call_timeout):
                if self.era is Era.MODERN:
                    before = self._listen_acks
                    self._listen_changed.set()
                    while self._listen_acks == before:
                        await self._listen_acked.wait()
                    if uri not in self._acked:
                        # Still watched (a later listen may take it), but the caller must poll for now.
                        self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="not acknowledged")
                        return False
                else:
                    await self.request("resources/subscribe", {"uri": uri})
        except trio.TooSlowError:
            del self.watched[uri]
            raise McpTransportError(f"subscribe {uri}: no answer within {self.config.call_timeout:g} s") from None
        except BaseException:
            self.watched.pop(uri, None)
            raise
        self.log.info("mcp.subscribe", server=self.name, uri=uri)
        return True

    async def unsubscribe(self, uri: str) -> None:
        if uri not in self.watched:
            return
        del self.watched[uri]
        if self.era is Era.MODERN:
            self._listen_changed.set()
            return
        with trio.fail_after(self.config.call_timeout):
            await self.request("resources/unsubscribe", {"uri": uri})
