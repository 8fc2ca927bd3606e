"""The MCP endpoint (``--serve-mcp``'s path and ``/mcp``): the sans-io server core carried over HTTP, on trio.

Per request, in order: the listener's gate (:mod:`agentd.transport.gate`: Host/Origin, then the bearer or an
OAuth token), body size (413 past ``max_body``) and body time (408), then :meth:`ServerCore.route`; what the
core cannot answer goes to the :class:`~agentd.transport.mcp_handler.McpHandler`.

Streams: a legacy session's GET stream (priming event, numbered replayable events, ``:`` keepalives), the
modern long-lived streams (``subscriptions/listen`` and a handler's own notification stream such as
``events/stream``: :mod:`agentd.transport.mcp_streams`), and long requests answered as SSE so keepalives flow
while they run (which ones is the handler's call: :meth:`McpHandler.streams`; this module knows no tool names).
All share one skeleton
(:mod:`agentd.transport.sse_response`). A closed response stream ends the HTTP request; whether the run it
started ends too is the handler's call (:attr:`CallContext.cancel_on_disconnect`: modern yes, legacy no).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from agentd import telemetry
from agentd.mcp import jsonrpc
from agentd.mcp.jsonrpc import ErrorResponse, Message, Notification, Request, Response
from agentd.mcp.server_session import (
    HttpReply,
    HttpRequest,
    LegacyPost,
    LegacySession,
    LegacyStream,
    ModernPost,
    Reply,
    ServerCore,
    error_reply,
    session_headers,
    updated_notification,
)
from agentd.mcp.sse import encode_event
from agentd.mcp.streamable_http import EVENT_STREAM, SESSION_ID, accepts, priming_event
from agentd.mcp.versions import Era
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from agentd.telemetry.names import JSONRPC_REQUEST_ID, TOOL_ERROR
from agentd.telemetry.spans import mcp_server_span
from agentd.transport.asgi import (
    Receive,
    Scope,
    Send,
    TooLarge,
    cancel_on_disconnect,
    discard_body,
    read_body,
    request_headers,
    send_reply,
)
from agentd.transport.gate import Gate
from agentd.transport.mcp_handler import CallContext, McpHandler
from agentd.transport.mcp_streams import ModernStreams
from agentd.transport.sse_response import sse_response
from agentd.transport.tenancy import LOCAL, Principal


@attrs.frozen
class EndpointLimits:
    """The endpoint's bounds (from ``AsgiOptions``; the defaults live there)."""

    max_body: int
    body_timeout: float
    keepalive: float
    #: Open ``subscriptions/listen`` streams, in total (one principal: the core's per-owner share).
    max_listens: int
    #: ``--serve-accept-cancel``: a legacy ``notifications/cancelled`` ends the run the named request started.
    accept_cancel: bool = False


class McpEndpoint:
    """The endpoint's ASGI app (``http`` scopes); ``draining`` ends its open streams (final listen frames)."""

    def __init__(self, handler: McpHandler, core: ServerCore, gate: Gate, limits: EndpointLimits, *,
                 log: EventLog, draining: trio.Event) -> None:
        self.handler = handler
        self.core = core
        self.gate = gate
        self.limits = limits
        self.log = log
        self.draining = draining
        self._streams: dict[str, trio.MemorySendChannel[tuple[int, bytes]]] = {}
        self._contexts: dict[str, CallContext] = {}
        self.modern_streams = ModernStreams(handler, core, keepalive=limits.keepalive,
                                            max_listens=limits.max_listens, log=log, draining=draining)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = request_headers(scope)
        refusal = self.gate.trust(headers)
        principal: HttpReply | Principal = LOCAL
        if refusal is None and self.gate.oauth is not None:
            principal = await self.gate.authenticate(headers)
        if isinstance(principal, HttpReply):
            refusal = principal
        if refusal is not None:
            await send_reply(send, refusal)
            return
        assert isinstance(principal, Principal)
        method = scope["method"]
        body = b""
        if method == "POST":
            limit = self.limits.max_body
            try:
                body = await read_body(headers, receive, limit=limit, timeout=self.limits.body_timeout)
            except TooLarge:
                metrics.served_request("refused")
                self.log.info("serve.refused", reason="body_too_large", limit=limit)
                await discard_body(headers, receive)
                await send_reply(send, error_reply(413, jsonrpc.INVALID_REQUEST,
                                                   f"request body exceeds {limit} bytes").http)
                return
            except trio.TooSlowError:
                metrics.served_request("refused")
                self.log.info("serve.refused", reason="body_timeout")
                await send_reply(send, error_reply(408, jsonrpc.INVALID_REQUEST, "request body too slow").http)
                return
        routed = self.core.route(HttpRequest(method, headers, body, principal.key), trio.current_time())
        if self.core.expired:
            for session_id in self.core.take_expired():
                self._end_session(session_id)
        if isinstance(routed, Reply):
            await send_reply(send, routed.http)
            if method == "DELETE" and routed.http.status == 200:
                self._end_session(headers.get(SESSION_ID.lower(), ""))
        elif isinstance(routed, LegacyPost):
            if routed.new_session:
                metrics.served_session(+1)
                self.log.debug("serve.session", action="created", version=routed.session.version,
                               sessions=len(self.core.sessions))
            await self._legacy_post(routed, headers, receive, send, principal)
        elif isinstance(routed, LegacyStream):
            await self._legacy_stream(routed, receive, send)
        else:
            await self._modern_post(routed, headers, receive, send, principal)

    async def _dispatch(self, request: Request, ctx: CallContext) -> Response | ErrorResponse:
        """The handler's answer; a bug in it becomes -32603 for this request instead of a 500 for all."""
        if not telemetry.enabled():  # no span to open, no trace context to adopt
            return _counted(await self._answer(request, ctx), None)
        params = request.params if isinstance(request.params, dict) else None
        meta = params.get("_meta") if params is not None else None
        # The client's trace context in ``_meta`` (the MCP convention) makes this request part of its trace.
        with (telemetry.remote_parent(meta if isinstance(meta, dict) else None),
              mcp_server_span(request.method, params, None) as span):
            span.set_attribute(JSONRPC_REQUEST_ID, str(request.id))
            return _counted(await self._answer(request, ctx), span)

    async def _answer(self, request: Request, ctx: CallContext) -> Response | ErrorResponse:
        try:
            return await self.handler.handle(request, ctx)
        except Exception as exc:
            self.log.error("serve.request", method=request.method, error=exc.__class__.__name__)
            return ErrorResponse(request.id, jsonrpc.INTERNAL_ERROR, "internal error")

    # -- legacy ------------------------------------------------------------------------------------------

    def _context(self, session: LegacySession, principal: Principal) -> CallContext:
        """The session's call context (and its ``notify``), built once per session; ``principal`` is this
        request's (the session's owner, with this token's scopes)."""
        ctx = self._contexts.get(session.id)
        if ctx is not None and ctx.principal != principal:
            return attrs.evolve(ctx, principal=principal)
        if ctx is None:
            def push(method: str, params: dict[str, Any]) -> None:
                seq, data = self.core.session_event(session, Notification(method, params))
                channel = self._streams.get(session.id)
                if channel is not None:
                    try:
                        channel.send_nowait((seq, data))
                    except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # stays in the replay buffer; a resumed GET gets it

            def notify(uri: str) -> None:
                note = updated_notification(uri)
                push(note.method, dict(note.params or {}))

            ctx = self._contexts[session.id] = CallContext(Era.LEGACY, session.id, notify, principal=principal,
                                                           push=push)
        return ctx

    def _end_session(self, session_id: str) -> None:
        metrics.served_session(-1)
        self.log.debug("serve.session", action="deleted")
        self.handler.session_closed(session_id)
        self._contexts.pop(session_id, None)
        channel = self._streams.pop(session_id, None)
        if channel is not None:
            channel.close()

    async def _legacy_post(self, post: LegacyPost, headers: Mapping[str, str], receive: Receive, send: Send,
                           principal: Principal = LOCAL) -> None:
        ctx = self._context(post.session, principal)
        if post.cancels and self.limits.accept_cancel:
            cancel_request = getattr(self.handler, "cancel_request", None)  # the self-MCP surface has it
            if cancel_request is not None:
                for request_id in post.cancels:
                    cancel_request(post.session.id, request_id)
        pending = [(i, slot) for i, slot in enumerate(post.slots) if isinstance(slot, Request)]
        if (len(pending) == 1 and not post.batch and accepts(headers.get("accept"), EVENT_STREAM)
                and self.handler.streams(pending[0][1])):
            index, request = pending[0]
            session = post.session

            def event_id() -> str:
                return str(session.next_id())

            async def answer() -> Message:
                return await self._dispatch(request, self._cancellable(ctx, request))

            await self._stream_answer(send, receive, answer, event_id, session_headers(post))
            return
        answers: dict[int, Message] = {}
        if len(pending) == 1:
            index, request = pending[0]
            answers[index] = await self._dispatch(request, self._cancellable(ctx, request))
        elif pending:
            async def one(index: int, request: Request) -> None:
                answers[index] = await self._dispatch(request, self._cancellable(ctx, request))

            async with trio.open_nursery() as nursery:
                for index, request in pending:
                    nursery.start_soon(one, index, request)
        await send_reply(send, self.core.legacy_reply(post, answers))

    def _cancellable(self, ctx: CallContext, request: Request) -> CallContext:
        """With ``--serve-accept-cancel``, the request's id goes with it (what it starts can be cancelled by it)."""
        return attrs.evolve(ctx, request_id=request.id) if self.limits.accept_cancel else ctx

    async def _legacy_stream(self, stream: LegacyStream, receive: Receive, send: Send) -> None:
        session = stream.session
        sender, receiver = trio.open_memory_channel[tuple[int, bytes]](256)
        self._streams[session.id] = sender
        self.log.debug("serve.session", action="stream_open")

        def closed() -> None:
            if self._streams.get(session.id) is sender:
                del self._streams[session.id]
            self.core.stream_closed(session, trio.current_time())

        async with sse_response(send, receive, keepalive=self.limits.keepalive, ends_on=self.draining,
                                closed=closed) as sse, receiver:
            await sse.send(stream.priming)
            for seq, data in stream.replay:
                await sse.send(data)
                self.core.delivered(session, seq)
            while True:
                try:
                    seq, data = await sse.wait(receiver.receive)
                except trio.EndOfChannel:
                    break
                await sse.send(data)
                self.core.delivered(session, seq)

    # -- modern ------------------------------------------------------------------------------------------

    async def _modern_post(self, post: ModernPost, headers: Mapping[str, str], receive: Receive, send: Send,
                           principal: Principal = LOCAL) -> None:
        request = post.request
        if request.method == "subscriptions/listen":
            await self.modern_streams.listen(request, headers, receive, send, principal)
            return
        ctx = CallContext(Era.MODERN, cancel_on_disconnect=True, principal=principal)
        if "accept" not in headers or accepts(headers["accept"], EVENT_STREAM):
            opened = self.handler.open_stream(request, ctx)
            if isinstance(opened, ErrorResponse):
                await send_reply(send, self.core.modern_reply(post, opened))
                return
            if opened is not None:
                await self.modern_streams.notifications(opened, receive, send)
                return
        if "accept" in headers and accepts(headers["accept"], EVENT_STREAM) and self.handler.streams(request):
            async def answer() -> Message:
                return await self._dispatch(request, ctx)

            def no_id() -> str | None:
                return None

            await self._stream_answer(send, receive, answer, no_id, (), modern=post)
            return
        if request.method != "tools/call":
            # Lists, reads and discover answer at once: no disconnect watcher (a task per request) needed.
            await send_reply(send, self.core.modern_reply(post, await self._dispatch(request, ctx)))
            return
        answers: list[Message] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope)
            answers.append(await self._dispatch(request, ctx))
            nursery.cancel_scope.cancel()
        if answers:
            await send_reply(send, self.core.modern_reply(post, answers[0]))

    # -- long answers as SSE -------------------------------------------------------------------------------

    async def _stream_answer(self, send: Send, receive: Receive, answer: Callable[[], Awaitable[Message]],
                             event_id: Callable[[], str | None], extra: tuple[tuple[str, str], ...], *,
                             modern: ModernPost | None = None) -> None:
        """Open SSE at once (priming event on legacy), keep it alive, then send the answer and end.

        A closed stream ends this request. Whether the run it started ends too is the handler's
        call (CallContext.cancel_on_disconnect: modern yes, legacy no)."""
        done: list[Message] = []
        async with sse_response(send, receive, keepalive=self.limits.keepalive, headers=extra) as sse:
            first = event_id()
            if first is not None:
                await sse.send(priming_event(first, self.core.retry_ms))
            finished = trio.Event()

            async def run() -> None:
                done.append(await answer())
                finished.set()

            sse.nursery.start_soon(run)
            await sse.wait(finished.wait)
            message = done[0]
            if modern is not None:
                payload = self.core.modern_reply(modern, message).body
            else:
                payload = jsonrpc.dumps(message)
            await sse.send(encode_event(payload.decode(), id=event_id()))


def _counted(answer: Response | ErrorResponse, span: telemetry.Span | None) -> Response | ErrorResponse:
    if isinstance(answer, ErrorResponse):
        if span is not None:
            telemetry.mark_error(span, str(answer.code))
        metrics.served_request("error")
    elif isinstance(answer.result, dict) and answer.result.get("isError") is True:
        if span is not None:
            telemetry.mark_error(span, TOOL_ERROR)
        metrics.served_request(TOOL_ERROR)
    else:
        metrics.served_request("ok")
    return answer


__all__ = ["EndpointLimits", "McpEndpoint"]
