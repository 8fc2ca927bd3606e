"""Request/response on a connection: sending a request, pumping its reply (resuming a legacy SSE response over
GET, re-issuing a side-effect-free modern one), abandoning it on cancellation, and dispatching every
incoming message to the sans-io session.

These are methods of :class:`agentd.client.connection.ServerConnection`, kept here so each module stays
readable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from agentd.client._streams import (
    CLEANUP_GRACE,
    DEFAULT_RETRY,
    RESUME_ATTEMPTS,
    STREAM_DRAIN_GRACE,
    Tuning,
    UpdateSink,
    _SessionGone,
    _StreamBroke,
    _Waiter,
)
from agentd.client.errors import ResponseStreamBroken
from agentd.config.model import McpServerConfig
from agentd.errors import McpError, McpProtocolError, McpRpcError, McpTransportError, ResourceNotFound
from agentd.events import EventLog
from agentd.mcp import jsonrpc
from agentd.mcp.client_session import (
    CapabilityMissing,
    ClientSession,
    ErrorReceived,
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
    reissue_safe,
    request_headers,
    valid_session_id,
)
from agentd.mcp.versions import LATEST_MODERN, Era
from agentd.transport.http_client import ConnectionLost, HttpReply, HttpTransport


class ExchangeMixin:
    """Requests out, messages in. Everything it uses is defined by ``ServerConnection``."""

    if TYPE_CHECKING:
        config: McpServerConfig
        transport: HttpTransport
        log: EventLog
        on_update: UpdateSink
        extra_headers: dict[str, str]
        tuning: Tuning
        session: ClientSession
        session_id: str | None
        connected: bool
        generation: int
        _waiters: dict[jsonrpc.RequestId, _Waiter]
        _refresh: set[str]
        _refresh_wanted: trio.Event
        _activity: float
        _inflight: int
        _idle: trio.Event
        _closing: bool

        @property
        def name(self) -> str: ...
        @property
        def era(self) -> Era | None: ...
        def _mark_broken(self, reason: str) -> None: ...
        async def wait_reconnected(self, generation: int) -> None: ...
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
