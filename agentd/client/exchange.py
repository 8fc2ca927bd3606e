"""The request/response side of one connection: sending a request, pumping its reply (resuming a legacy SSE
response over GET, re-issuing a side-effect-free modern one), abandoning it on cancellation, and
dispatching every incoming message, on whichever stream it arrives, to the sans-io session.

It exists so that everything which turns a JSON-RPC request into an answer over HTTP sits in one place,
beside the session that numbers the requests and matches their answers. It owns the session, the
transport and the legacy session id; it knows nothing of the catalogue, subscriptions or push streams:
notifications it cannot settle itself go to the ``on_notification`` callback, and a transport that is
gone is reported to the shared :class:`~agentd.client.liveness.Liveness`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

import attrs
import trio

from agentd import telemetry
from agentd.client.errors import ResponseStreamBroken
from agentd.client.liveness import Liveness
from agentd.errors import McpError, McpProtocolError, McpRpcError, McpTransportError, ResourceNotFound
from agentd.mcp import failure_policy, input_required, jsonrpc
from agentd.mcp.client_session import (
    CapabilityMissing,
    ClientSession,
    ErrorReceived,
    NotificationReceived,
    ResponseReceived,
    ResultTypeError,
    ServerRequestAnswered,
    ServerRequestReceived,
    SessionError,
    State,
)
from agentd.mcp.streamable_http import (
    LAST_EVENT_ID,
    SESSION_ID,
    Body,
    endpoint_hint,
    reissue_safe,
    request_headers,
    valid_session_id,
)
from agentd.mcp.versions import LATEST_MODERN, Era
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from agentd.telemetry.names import JSONRPC_REQUEST_ID, TOOL_ERROR
from agentd.telemetry.spans import mcp_client_span, with_trace_meta
from agentd.transport.http_client import ConnectionLost, HttpReply, HttpTransport

#: Bound on the shielded clean-up sends (notifications/cancelled, DELETE).
CLEANUP_GRACE: Final = 2.0
#: How often a SSE response with an event id may be resumed over GET before the request fails.
RESUME_ATTEMPTS: Final = 5
#: How long to wait before resuming a stream whose server gave no ``retry``.
DEFAULT_RETRY: Final = 1.0
#: How long to read on after a POST stream's answer so the connection can be reused.
STREAM_DRAIN_GRACE: Final = 0.05
#: The requests that open a connection: an HTTP 404/405 on them means a wrong endpoint, so the error hints.
_FIRST_REQUESTS: Final = frozenset({"initialize", "server/discover"})

NotificationSink = Callable[[str, dict[str, Any]], None]


class SessionGone(Exception):
    """A 404 on a request that carried our session id: the server forgot the session."""


class StreamBroke(Exception):
    """A modern response (JSON or SSE) broke or ended before its answer: re-issue it, or surface it typed."""

    def __init__(self, detail: str, request_id: jsonrpc.RequestId) -> None:
        super().__init__(detail)
        self.detail = detail
        self.request_id = request_id


@attrs.define(eq=False)
class _Waiter:
    event: trio.Event = attrs.field(factory=trio.Event)
    result: dict[str, Any] | None = None
    error: jsonrpc.ErrorResponse | None = None


@attrs.define(eq=False)
class Exchange:
    """Requests out, messages in, for one server."""

    name: str
    transport: HttpTransport
    session: ClientSession
    log: EventLog
    liveness: Liveness
    #: Where ``resources/updated`` and ``list_changed`` notifications go.
    on_notification: NotificationSink
    #: How long a request that met a forgotten session waits for the new one before it fails.
    reconnect_wait: float
    extra_headers: dict[str, str] = attrs.field(factory=dict)
    session_id: str | None = None
    #: When the server last sent anything (the pinger keeps quiet while it talks).
    activity: float = 0.0
    #: Set once the connection is closing: new requests are refused.
    closing: bool = False
    _waiters: dict[jsonrpc.RequestId, _Waiter] = attrs.field(factory=dict)
    #: Requests between POST and their abandon step; closing waits for them so a run cancelled as a whole
    #: still sends every ``notifications/cancelled`` before the session is deleted.
    _inflight: int = 0
    _idle: trio.Event = attrs.field(factory=trio.Event)

    def reset(self) -> None:
        """A new handshake starts: a fresh session, no session id."""
        self.session.reset()
        self.session_id = None

    async def wait_idle(self) -> None:
        """Wait until no request is between its POST and its abandon step (the caller bounds the wait)."""
        while self._inflight:
            await self._idle.wait()

    def headers_for(self, request: jsonrpc.Request | None, *, get: bool = False) -> dict[str, str]:
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
        self, method: str, params: dict[str, Any] | None = None, *, headers: dict[str, str] | None = None,
        idempotent: bool = False,
    ) -> dict[str, Any]:
        """One request on the live session, re-sent as the failure policy allows (agentd.mcp.failure_policy:
        safe requests, and ``idempotent`` tools/calls that never reached the server), with bounded backoff and
        a bounded wait for a reconnect in between. The caller bounds the whole (``call_timeout``)."""
        kind = failure_policy.request_kind(method, idempotent=idempotent)
        retry = 0
        while True:
            try:
                return await self._request_recovering(method, params, headers)
            except McpError as exc:
                failure = failure_policy.classify(exc)
                decision = failure_policy.decide(failure, kind)
                if retry >= decision.retries or self.closing:
                    raise
                if isinstance(exc, ResponseStreamBroken) and exc.reissued:
                    raise  # a broken modern stream was re-issued at once already: that was its retry
                retry += 1
                delay = failure_policy.backoff(retry)
                self.log.warn("mcp.retry", server=self.name, method=method, attempt=retry + 1, delay=delay,
                              failure=failure.value, error=str(exc))  # fmt: skip
            generation = self.liveness.generation
            await trio.sleep(delay)
            if not self.liveness.connected or self.liveness.broken.is_set():
                with trio.move_on_after(self.reconnect_wait):  # a newer connection than the one that failed
                    await self.liveness.wait_reconnected(generation)

    async def _request_recovering(
        self, method: str, params: dict[str, Any] | None, headers: dict[str, str] | None
    ) -> dict[str, Any]:
        """One request; a 404 on the session re-initializes and retries once."""
        if self.closing:
            raise McpTransportError(f"MCP server {self.name!r}: the connection is closing", server=self.name)
        if not self.liveness.connected:
            raise McpTransportError(f"MCP server {self.name!r} is not connected (reconnecting)", server=self.name,
                                    unsent=True)  # fmt: skip
        generation = self.liveness.generation
        try:
            return await self.request_once(method, params, headers)
        except SessionGone:
            self.liveness.mark_broken("the server forgot the session (404)")
        with trio.move_on_after(self.reconnect_wait) as waiting:
            await self.liveness.wait_reconnected(generation)
        if waiting.cancelled_caught:
            raise McpTransportError(
                f"{method}: the server forgot the session (404) and no new one came up in time", server=self.name
            )
        try:
            return await self.request_once(method, params, headers)
        except SessionGone:
            raise McpTransportError(f"{method}: the server forgot the session twice", server=self.name) from None

    async def request_once(
        self, method: str, params: dict[str, Any] | None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """One request (no 404 recovery). On the modern wire an ``input_required`` answer is followed up
        (agentd.mcp.input_required: each round under a new id, ``requestState`` echoed, capped rounds)."""
        result = await self._request_reissuing(method, params, headers)
        if self.session.era is not Era.MODERN:
            return result
        rounds = 0
        while True:
            answers = await self._input_answers(result) if self.session.declared else None
            try:
                step = input_required.follow_up(method, params, result, rounds, answers)
            except ResultTypeError as exc:
                raise McpProtocolError(f"{method}: {exc}", server=self.name) from None
            if step is None:
                return result
            rounds += 1
            if step.delay:
                await trio.sleep(step.delay)
            result = await self._request_reissuing(method, step.params, headers)

    async def _request_reissuing(
        self, method: str, params: dict[str, Any] | None, headers: dict[str, str] | None
    ) -> dict[str, Any]:
        """On the modern wire a response stream that breaks before the answer is re-issued once under a new
        id when the method is side-effect free, else surfaced typed."""
        try:
            return await self._request_attempt(method, params, headers)
        except StreamBroke as exc:
            if not reissue_safe(method):
                raise self.stream_broken(method, exc, reissued=False) from None
            self.log.warn("mcp.stream", server=self.name, method=method, reissued=True, request_id=exc.request_id,
                          error=exc.detail)  # fmt: skip
        try:
            return await self._request_attempt(method, params, headers)
        except StreamBroke as exc:
            raise self.stream_broken(method, exc, reissued=True) from None

    def stream_broken(self, method: str, exc: StreamBroke, *, reissued: bool) -> ResponseStreamBroken:
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
            result = await self.roundtrip(request, headers)
        except trio.Cancelled:
            await self._abandon(request, "the request was cancelled")
            raise
        except ConnectionLost as exc:
            self.liveness.mark_broken(str(exc))
            raise
        finally:
            self.session.pending.pop(request.id, None)  # answered, failed or abandoned: forget it
            self._inflight -= 1
            if not self._inflight:
                idle, self._idle = self._idle, trio.Event()
                idle.set()
        return result

    async def _abandon(self, request: jsonrpc.Request, reason: str) -> None:
        """Tell a legacy server we stopped waiting (never for initialize); shielded and bounded."""
        notification = self.session.cancel(request.id, reason)
        if notification is None or not self.liveness.connected:
            return
        with trio.move_on_after(CLEANUP_GRACE, shield=True):
            try:
                await self.post(notification)
            except (McpError, SessionGone):
                pass
        self.log.info("mcp.cancelled", server=self.name, request_id=request.id, method=request.method)

    async def roundtrip(self, request: jsonrpc.Request, extra: dict[str, str] | None = None) -> dict[str, Any]:
        """POST one request and pump replies until its answer arrives (resuming over GET if allowed).

        Every MCP request agentd sends passes here: each is one ``{method} {target}`` client span, with the
        trace context in its ``params._meta`` (the MCP convention), and one observation of the duration
        histogram."""
        started = time.perf_counter()
        method = request.method
        with mcp_client_span(self.name, method, request.params, self.session.protocol_version) as span:
            span.set_attribute(JSONRPC_REQUEST_ID, str(request.id))
            if telemetry.enabled():
                request = attrs.evolve(request, params=with_trace_meta(request.params))
            try:
                result = await self._roundtrip(request, extra)
            except McpRpcError as exc:
                telemetry.mark_error(span, str(exc.code))
                metrics.mcp_request(method, self.name, time.perf_counter() - started, str(exc.code))
                raise
            except (McpError, ConnectionLost, SessionGone, StreamBroke) as exc:
                telemetry.mark_error(span, type(exc).__name__)
                metrics.mcp_request(method, self.name, time.perf_counter() - started, type(exc).__name__)
                raise
            error = TOOL_ERROR if method == "tools/call" and result.get("isError") is True else ""
            if error:
                telemetry.mark_error(span, error)
            metrics.mcp_request(method, self.name, time.perf_counter() - started, error)
            return result

    async def _roundtrip(self, request: jsonrpc.Request, extra: dict[str, str] | None) -> dict[str, Any]:
        waiter = _Waiter()
        self._waiters[request.id] = waiter
        body = jsonrpc.dumps(request)
        headers = self.headers_for(request)
        if extra:
            headers.update(extra)
        resume: tuple[str | None, int | None] = (None, None)
        # 2026-07-28 has no resumability: a response that breaks before its answer is a StreamBroke.
        modern = request.method == "server/discover" or self.session.era is Era.MODERN
        opened = False
        try:
            try:
                async with self.transport.open(
                    "POST", headers, body, had_session=self.session_id is not None
                ) as reply:
                    opened = True
                    if reply.kind is Body.SESSION_GONE:
                        raise SessionGone()
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
                            raise StreamBroke(f"the event stream ended {where}", request.id)
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
                    raise StreamBroke(str(exc), request.id) from None
                raise
            if not waiter.event.is_set() and resume[0] is not None and not modern:
                await self._resume(waiter, request, resume[0], resume[1])
        finally:
            self._waiters.pop(request.id, None)
        if waiter.error is not None:
            raise self.rpc_error(waiter.error, request)
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
                hint = endpoint_hint(reply.status, had_session=request.method not in _FIRST_REQUESTS)
                raise McpTransportError(
                    f"{request.method}: HTTP {reply.status}" + (f" ({hint})" if hint else ""), server=self.name
                )
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
            await self.dispatch(message)

    async def _drain_stream(self, reply: HttpReply) -> None:
        """Read the end of a POST's event stream after its answer (the server SHOULD close it right away).

        Reading to the end lets httpx reuse the connection; a server that keeps the stream open costs at
        most ``STREAM_DRAIN_GRACE`` and the connection.
        """
        with trio.move_on_after(STREAM_DRAIN_GRACE):
            try:
                while (message := await reply.receive()) is not None:
                    await self.dispatch(message)
            except McpError as exc:
                self.log.debug("mcp.protocol_error", server=self.name, what=f"after the answer: {exc}")

    async def _resume(self, waiter: _Waiter, request: jsonrpc.Request, last_id: str, retry_ms: int | None) -> None:
        """The SSE response closed before the answer: reconnect with GET + Last-Event-ID after ``retry``."""
        for _ in range(RESUME_ATTEMPTS):
            await trio.sleep(retry_ms / 1000 if retry_ms is not None else DEFAULT_RETRY)
            headers = self.headers_for(None, get=True)
            headers[LAST_EVENT_ID] = last_id
            async with self.transport.open("GET", headers, had_session=self.session_id is not None) as reply:
                if reply.kind is Body.SESSION_GONE:
                    raise SessionGone()
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

    def rpc_error(self, error: jsonrpc.ErrorResponse, request: jsonrpc.Request) -> McpRpcError:
        params = request.params or {}
        if request.method == "resources/read" and error.code in (jsonrpc.RESOURCE_NOT_FOUND, jsonrpc.INVALID_PARAMS):
            uri = error.data.get("uri") if isinstance(error.data, dict) else None
            return ResourceNotFound(
                uri if isinstance(uri, str) else str(params.get("uri")), error.code, error.message, error.data,
                server=self.name,
            )  # fmt: skip
        return McpRpcError(error.code, error.message, error.data, server=self.name, method=request.method)

    async def post(self, message: jsonrpc.Message) -> None:
        """POST a notification or a response to a server request; expect 202."""
        headers = self.headers_for(message if isinstance(message, jsonrpc.Request) else None)
        if self.session.era is Era.MODERN and isinstance(message, jsonrpc.Notification):
            headers["Mcp-Method"] = message.method
        async with self.transport.open(
            "POST", headers, jsonrpc.dumps(message), had_session=self.session_id is not None
        ) as reply:
            if reply.kind is Body.SESSION_GONE:
                raise SessionGone()
            if reply.kind not in (Body.ACCEPTED, Body.JSON, Body.SSE):
                self.log.warn("mcp.protocol_error", server=self.name, what=f"HTTP {reply.status} to a notification")

    async def _answer_request(self, request: jsonrpc.Request) -> jsonrpc.Response | jsonrpc.ErrorResponse:
        """A request the host opted this server in to (elicitation, sampling): answered by the run whose tool call
        it arrived in (agentd.oversight.approvals.current_answerer); outside a call, an elicitation is declined and sampling
        refused. Waits as long as the answer takes: the call's own timeout and the run's deadline bound it."""
        from agentd.oversight.approvals import Refused, current_answerer

        answerer = current_answerer()
        params = request.params if isinstance(request.params, dict) else {}
        try:
            if answerer is not None:
                return ClientSession.answer(request, await answerer(self.name, request.method, params))
            if request.method == "elicitation/create":
                return ClientSession.answer(request, {"action": "decline"})
            raise Refused(jsonrpc.INTERNAL_ERROR, "no run is calling this server now: nothing to sample for")
        except Refused as exc:
            return ClientSession.answer(request, None, (exc.code, exc.message))

    async def _input_answers(self, result: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
        """The modern wire's embedded input requests this server was opted in to (``input_required``), answered
        like the legacy wire's server requests (:meth:`_answer_request`); a refused one is left to
        agentd.mcp.input_required (which then fails the call as a protocol error)."""
        requests = result.get("inputRequests") if result.get("resultType") == "input_required" else None
        if not isinstance(requests, dict):
            return None
        answers: dict[str, dict[str, Any]] = {}
        for key, embedded in requests.items():
            method = embedded.get("method") if isinstance(embedded, dict) else None
            if not isinstance(method, str) or not self.session.declares(method):
                continue
            params = embedded.get("params")
            reply = await self._answer_request(jsonrpc.Request(0, method, params if isinstance(params, dict) else None))
            if isinstance(reply, jsonrpc.Response):
                answers[str(key)] = reply.result
        return answers

    async def dispatch(self, message: jsonrpc.Message) -> None:
        self.activity = trio.current_time()
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
                    await self.post(event.reply)
                except (McpError, SessionGone) as exc:
                    self.log.warn("mcp.protocol_error", server=self.name, what=f"answering a server request: {exc}")
        elif isinstance(event, ServerRequestReceived):
            self.log.info("mcp.server_request", server=self.name, method=event.request.method)
            reply = await self._answer_request(event.request)
            if self.session.era is not Era.MODERN:
                try:
                    await self.post(reply)
                except (McpError, SessionGone) as exc:
                    self.log.warn("mcp.protocol_error", server=self.name, what=f"answering a server request: {exc}")
        elif isinstance(event, NotificationReceived):
            self.on_notification(event.method, event.params)
            if event.method == "notifications/resources/updated":
                # What the update started (a wake, handed over at once: agentd.modes.watch) takes its first
                # step, up to its own first wait, before this task goes back to reading the stream. Every task
                # runnable now runs in the next scheduling batch, in either order: so two rounds, not one.
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
        else:
            self.log.debug("mcp.protocol_error", server=self.name, what="a response for no pending request")

