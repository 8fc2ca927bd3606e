"""A raw ASGI app that carries the sans-io server core over HTTP, on trio (no web framework).

Per request, in order: path (404), Host/Origin (403, DNS rebinding), bearer (401 with
``WWW-Authenticate: Bearer``, compared in constant time) or, with ``AsgiOptions.oauth``, an OAuth access
token (:mod:`agentd.transport.resource_server`: 401 with the ``resource_metadata`` challenge, 403 for
missing scope; the static bearer, when also set, is accepted too), body size (413 past 8 MiB) and body
time (408), then :meth:`ServerCore.route`. With OAuth on, the RFC 9728 metadata document is served at
``/.well-known/oauth-protected-resource[/path]`` without a token. Requests the core cannot answer go to an
:class:`McpHandler`.

Streams: a legacy session's GET stream (priming event, numbered replayable events, ``:`` keepalives),
a modern ``subscriptions/listen`` stream (ack first, ``subscriptionId`` on every frame, final frame on
drain), a modern request the handler answers with a stream of notifications (:meth:`McpHandler.open_stream`:
the handler's frames, final frame on drain, ended when the reader takes no frame within
``SERVE_EVENTS_SEND_TIMEOUT``), and long requests answered as SSE so keepalives flow while they run (which ones
is the handler's call: :meth:`McpHandler.streams`; this module knows no tool names). All share one skeleton
(:meth:`McpAsgiApp._sse`). A closed response stream ends the HTTP request; whether the run it started
ends too is the handler's call (:attr:`CallContext.cancel_on_disconnect`: modern yes, legacy no).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, Protocol, TypeVar

import attrs
import trio

from agentd import defaults, telemetry
from agentd.events import EventLog, null_log
from agentd.mcp import jsonrpc, meta
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
    ServerIdentity,
    error_reply,
    session_headers,
    updated_notification,
)
from agentd.mcp.sse import encode_comment, encode_event
from agentd.mcp.streamable_http import EVENT_STREAM, SESSION_ID, accepts, priming_event
from agentd.mcp.versions import Era
from agentd.telemetry import metrics
from agentd.telemetry.health import PROBES, probe
from agentd.telemetry.names import JSONRPC_REQUEST_ID, TOOL_ERROR
from agentd.telemetry.spans import mcp_server_span
from agentd.telemetry.stream import EVENTS_PATH, MAX_SUBSCRIBERS, Subscriber, current_bus
from agentd.transport.resource_server import Rejected, ResourceServer, bearer_token
from agentd.transport.tenancy import LOCAL, Owners, Principal, oauth_principal
from agentd.transport.ui_app import is_ui_path, ui_answer, with_session

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MAX_BODY: Final = defaults.SERVE_MAX_BODY
LOOPBACK_HOSTS: Final = frozenset({"localhost", "127.0.0.1", "::1"})
KEEPALIVE: Final = encode_comment("keepalive")
#: ``/events`` subscribers one OAuth principal may hold at once (a quarter of the daemon's).
EVENTS_PER_PRINCIPAL: Final = max(1, MAX_SUBSCRIBERS // defaults.SERVE_SESSIONS_PER_OWNER_DIVISOR)
_T = TypeVar("_T")


@attrs.frozen
class CallContext:
    """What a handler knows about the request it answers."""

    era: Era
    session_id: str | None = None
    #: Pushes ``notifications/resources/updated{uri}`` onto this legacy session's GET stream.
    notify: Callable[[str], None] | None = None
    #: Pushes any notification (``method``, ``params``) onto this legacy session's GET stream (replayable like
    #: ``notify``'s; a session with no stream open keeps it for a resumed GET).
    push: Callable[[str, dict[str, Any]], None] | None = None
    #: Modern wire: a closed response stream cancels the request (and what it started).
    cancel_on_disconnect: bool = False
    #: Who is calling (agentd.transport.tenancy): what it creates is its own, and it sees only that.
    principal: Principal = LOCAL
    #: Legacy wire with ``--serve-accept-cancel``: this request's id, which a ``notifications/cancelled`` of its
    #: session may name (None: nothing can cancel it that way).
    request_id: jsonrpc.RequestId | None = None


@attrs.define(eq=False)
class ListenTicket:
    """One ``subscriptions/listen`` stream as the handler sees it: the URIs it honored (``fire_now``: already
    changed, an update right after the ack), and the task ids it agreed to send ``notifications/tasks`` for
    (``tasks_now``: the tasks whose status is to be sent right after the ack)."""

    honored: list[str]
    fire_now: list[str]
    tasks: list[str] = attrs.field(factory=list)
    tasks_now: list[dict[str, Any]] = attrs.field(factory=list)


class NotificationStream(Protocol):
    """A modern request answered by a stream of frames (``events/stream``): the handler's, written in order."""

    async def next_frame(self) -> dict[str, Any]:
        """The next frame (waits as long as it must; bounded by the handler's own heartbeat)."""
        ...

    def final(self) -> dict[str, Any]:
        """The frame that ends the stream when the server ends it (drain)."""
        ...

    def close(self) -> None:
        """Release what the stream holds; called once however it ends."""
        ...


class McpHandler(Protocol):
    identity: ServerIdentity

    async def handle(self, request: Request, ctx: CallContext) -> Response | ErrorResponse: ...

    def streams(self, request: Request) -> bool:
        """Whether to answer ``request`` as SSE (when the peer accepts it) so keepalives flow while it runs."""
        ...

    def open_stream(self, request: Request, ctx: CallContext) -> NotificationStream | ErrorResponse | None:
        """A modern request the handler answers as a stream of notifications, or the error refusing it before
        any stream opens; None for a request answered the ordinary way."""
        ...

    def listen(self, uris: list[str], sink: Callable[[str], None], principal: Principal = LOCAL, *,
               task_ids: tuple[str, ...] = (), task_sink: Callable[[dict[str, Any]], None] | None = None,
               ) -> ListenTicket:
        """Register a modern listen stream: ``sink`` hears updated URIs, ``task_sink`` the current status of the
        honored ``task_ids`` (a ``notifications/tasks`` body) each time it changes."""
        ...

    def unlisten(self, ticket: ListenTicket) -> None: ...

    def session_closed(self, session_id: str) -> None: ...


@attrs.frozen
class AsgiOptions:
    paths: frozenset[str] = frozenset({"/mcp"})
    bearer: str | None = attrs.field(default=None, repr=False)
    #: Host names accepted in ``Host``/``Origin``; ``None`` accepts any Host and same-host Origins.
    allowed_hosts: frozenset[str] | None = LOOPBACK_HOSTS
    max_body: int = MAX_BODY
    body_timeout: float = 30.0
    keepalive: float = defaults.SERVE_KEEPALIVE
    max_sessions: int = defaults.SERVE_MAX_SESSIONS
    #: OAuth access tokens (``--serve-oauth-issuer``); None: no tokens accepted beyond ``bearer``.
    oauth: ResourceServer | None = attrs.field(default=None, eq=False, repr=False)
    #: ``--serve-oauth-operator-scope``: a token carrying it is an operator (sees every principal's state).
    operator_scope: str | None = None
    #: ``--serve-accept-cancel``: a legacy ``notifications/cancelled`` ends the run the named request started
    #: (``McpHandler.cancel_request``); off, it is ignored.
    accept_cancel: bool = False


#: A Host header: a DNS name, an IPv4 address or a bracketed IPv6 address, then an optional port (RFC 9110
#: 7.2; no userinfo, path or anything else). An Origin is ``http``/``https`` ``://`` and the same (RFC 6454).
_REG_NAME: Final = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_](?:[a-z0-9_-]{0,62}))*\.?")
_AUTHORITY: Final = re.compile(r"(?P<host>\[[0-9a-f:.]+\]|[a-z0-9._-]+)(?::(?P<port>[0-9]{1,5}))?")


@attrs.frozen
class Authority:
    """A strictly parsed Host header or Origin: the host (lower case, brackets and a trailing dot removed) and
    the port, if one was given."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def parse_authority(value: str) -> Authority | None:
    """``host[:port]`` of a Host header, strictly: anything else (userinfo ``a@b``, a path, a backslash,
    whitespace, an empty or out-of-range port) is None, never a guess at which part is the host."""
    match = _AUTHORITY.fullmatch(value.lower())
    if match is None:
        return None
    host, port = match["host"], match["port"]
    if host.startswith("["):
        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            return None
    elif _REG_NAME.fullmatch(host) is None or len(host) > 253:
        return None
    number = None
    if port is not None:
        number = int(port)
        if not 0 < number < 65536:
            return None
    return Authority(host.rstrip("."), number)


def parse_origin(value: str) -> Authority | None:
    """The authority of an ``Origin`` header (``http``/``https`` scheme, nothing after the authority), else None
    (``null`` and anything malformed included)."""
    scheme, sep, rest = value.lower().partition("://")
    if not sep or scheme not in ("http", "https"):
        return None
    return parse_authority(rest)


#: How much of an oversized body is read and thrown away before the 413, so the connection closes with
#: nothing unread: closing a socket with unread data sends a TCP reset, which makes the peer's kernel drop
#: the 413 it had already received ("server disconnected"). Past this the peer may see a reset instead.
DISCARD_MAX: Final = 4 * 1024 * 1024
DISCARD_TIME: Final = 2.0


async def _discard_body(headers: Mapping[str, str], receive: Receive) -> None:
    """Read the rest of a refused body, bounded in bytes and time; a body declared larger is not read."""
    length = headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > DISCARD_MAX:
        return
    seen = 0
    with trio.move_on_after(DISCARD_TIME):
        while seen <= DISCARD_MAX:
            message = await receive()
            if message["type"] != "http.request":
                return
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        if name in out:
            out[name] = f"{out[name]}, {raw_value.decode('latin-1')}"
        else:
            out[name] = raw_value.decode("latin-1")
    return out


class _TooLarge(Exception):
    pass


class McpAsgiApp:
    """The ASGI callable. ``drain()`` ends open streams gracefully (final listen frames, then close)."""

    def __init__(self, handler: McpHandler, options: AsgiOptions | None = None, *, log: EventLog | None = None,
                 core: ServerCore | None = None, owners: Owners | None = None) -> None:
        self.handler = handler
        self.options = options or AsgiOptions()
        self.log = log or null_log()
        self.core = core or ServerCore(handler.identity, max_sessions=self.options.max_sessions)
        #: The served handles' owners (shared with the handler), for ``/events``.
        self.owners = owners if owners is not None else Owners()
        self.draining = trio.Event()
        self._streams: dict[str, trio.MemorySendChannel[tuple[int, bytes]]] = {}
        self._contexts: dict[str, CallContext] = {}
        self._listens = 0
        self._listens_by: dict[str, int] = {}
        self._events_by: dict[str, int] = {}

    def drain(self) -> None:
        self.draining.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._events(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.drain()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- the request pipeline ----------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("path") in PROBES and scope["method"] in ("GET", "HEAD"):
            # Liveness and readiness: no authentication, no information beyond ok / not ok.
            status, text = probe(scope["path"])
            await _send_reply(send, HttpReply(status, text, "text/plain"))
            return
        headers = _headers(scope)
        if is_ui_path(scope.get("path", "")):  # the live page (agentd.transport.ui_app): /events' gate, then a file
            await _send_reply(send, await ui_answer(scope, headers, receive, trust=self._trust,
                                                    authorize=self.authorize, bearer=self.options.bearer))
            return
        refusal = self._gate(scope, headers)
        principal: HttpReply | Principal = LOCAL
        if refusal is None and self.options.oauth is not None:
            principal = await self.authenticate(headers)
        if isinstance(principal, HttpReply):
            refusal = principal
        if refusal is not None:
            await _send_reply(send, refusal)
            return
        assert isinstance(principal, Principal)
        body = b""
        if scope["method"] == "POST":
            try:
                body = await self._read_body(headers, receive)
            except _TooLarge:
                metrics.served_request("refused")
                self.log.info("serve.refused", reason="body_too_large", limit=self.options.max_body)
                await _discard_body(headers, receive)
                await _send_reply(send, error_reply(413, jsonrpc.INVALID_REQUEST,
                                                    f"request body exceeds {self.options.max_body} bytes").http)
                return
            except trio.TooSlowError:
                metrics.served_request("refused")
                self.log.info("serve.refused", reason="body_timeout")
                await _send_reply(send, error_reply(408, jsonrpc.INVALID_REQUEST, "request body too slow").http)
                return
        routed = self.core.route(HttpRequest(scope["method"], headers, body, principal.key), trio.current_time())
        if self.core.expired:
            self._forget_expired()
        if isinstance(routed, Reply):
            await _send_reply(send, routed.http)
            if scope["method"] == "DELETE" and routed.http.status == 200:
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

    def _gate(self, scope: Scope, headers: Mapping[str, str]) -> HttpReply | None:
        path = scope.get("path", "")
        oauth = self.options.oauth
        metadata = oauth is not None and path in oauth.metadata_paths
        if not metadata and path not in self.options.paths and path.rstrip("/") not in self.options.paths:
            return HttpReply(404, b"not found", "text/plain")
        refusal = self._trust(headers)
        if refusal is not None or oauth is None or not metadata:
            return refusal
        if scope["method"] != "GET":  # the protected-resource metadata: no token needed
            return HttpReply(405, b"method not allowed", "text/plain", headers=(("allow", "GET"),))
        return HttpReply(200, oauth.metadata(), "application/json", headers=(("cache-control", "max-age=300"),))

    def _trust(self, headers: Mapping[str, str]) -> HttpReply | None:
        """Host/Origin (DNS rebinding) and the bearer token: the same for the MCP endpoint and ``/events``."""
        allowed = self.options.allowed_hosts
        authority = parse_authority(headers.get("host", ""))
        host = authority.host if authority is not None else None
        if host is None or (allowed is not None and host not in allowed):
            metrics.served_request("refused")
            self.log.info("serve.refused", reason="host", status=403)
            return error_reply(403, jsonrpc.INVALID_REQUEST, "Forbidden: Host not allowed").http
        origin = headers.get("origin")
        if origin is not None:
            parsed = parse_origin(origin)
            origin_host = parsed.host if parsed is not None else None
            ok = origin_host is not None and (origin_host in allowed if allowed is not None else origin_host == host)
            if not ok:
                metrics.served_request("refused")
                self.log.info("serve.refused", reason="origin", status=403)
                return error_reply(403, jsonrpc.INVALID_REQUEST, "Forbidden: Origin not allowed").http
        if self.options.oauth is not None:
            return None  # the token (or the static bearer) is checked by authorize(): keys may need fetching
        if self.options.bearer is not None and not self._bearer_ok(headers):
            metrics.served_request("refused")
            self.log.info("serve.refused", reason="bearer", status=401)
            return HttpReply(401, jsonrpc.dumps(ErrorResponse(None, jsonrpc.INVALID_REQUEST, "Unauthorized")),
                             headers=(("www-authenticate", 'Bearer realm="agentd"'),))
        return None

    def _bearer_ok(self, headers: Mapping[str, str]) -> bool:
        """The static bearer matches (constant time); False when none is configured."""
        expected = self.options.bearer
        if expected is None:
            return False
        scheme, _, token = headers.get("authorization", "").partition(" ")
        good = hmac.compare_digest(token.strip().encode(), expected.encode())
        return scheme.lower() == "bearer" and good

    async def authorize(self, headers: Mapping[str, str]) -> HttpReply | None:
        """With OAuth on, what ``_gate`` leaves to be awaited: the static bearer or a valid access token.
        Whoever calls ``_gate`` calls this after it (the A2A mount too)."""
        verdict = await self.authenticate(headers)
        return verdict if isinstance(verdict, HttpReply) else None

    async def authenticate(self, headers: Mapping[str, str]) -> HttpReply | Principal:
        """:meth:`authorize`, and who passed it (agentd.transport.tenancy): an accepted token's principal;
        without OAuth, or with the static bearer beside it, the listener's single principal."""
        oauth = self.options.oauth
        if oauth is None or self._bearer_ok(headers):
            return LOCAL
        authorization = headers.get("authorization")
        verdict = await oauth.check(authorization)
        if not isinstance(verdict, Rejected):
            return oauth_principal(oauth.settings.issuer, verdict.subject, verdict.client_id, verdict.scopes,
                                   bearer_token(authorization) or "", self.options.operator_scope)
        metrics.served_request("refused")
        self.log.info("serve.refused", reason=verdict.reason, status=verdict.status)
        if verdict.status == 503:
            return error_reply(503, jsonrpc.INTERNAL_ERROR, "authorization server keys unavailable",
                               headers=(("retry-after", "30"),)).http
        message = "Forbidden: insufficient scope" if verdict.status == 403 else "Unauthorized"
        return HttpReply(verdict.status, jsonrpc.dumps(ErrorResponse(None, jsonrpc.INVALID_REQUEST, message)),
                         "application/json", headers=(("www-authenticate", oauth.challenge(verdict)),))

    async def _events(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/events``: the daemon's event lines and ``tree.node`` changes as WebSocket text frames (JSON), with
        the endpoint's authentication; refused (HTTP 403 before the handshake) without it, or when the daemon
        has no stream or enough subscribers (one OAuth principal: a quarter of them). A principal sees the lines
        of its own runs only (agentd.transport.tenancy)."""
        bus = current_bus()
        headers = with_session(_headers(scope), self.options.bearer)  # the /ui/ page's login cookie, if any
        principal: HttpReply | Principal = LOCAL
        refused = scope.get("path") != EVENTS_PATH or self._trust(headers) is not None
        if not refused:
            principal = await self.authenticate(headers)
        refused = refused or isinstance(principal, HttpReply) or bus is None or bus.full or self.draining.is_set()
        key = principal.key if isinstance(principal, Principal) else LOCAL.key
        mine = self._events_by.get(key, 0)
        if isinstance(principal, Principal) and principal.bounded and mine >= EVENTS_PER_PRINCIPAL:
            refused = True  # one principal cannot take every /events slot
        message = await receive()
        if message.get("type") != "websocket.connect" or refused or bus is None or isinstance(principal, HttpReply):
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "websocket.accept"})
        owners, who = self.owners, principal

        def accepts(line: Mapping[str, Any]) -> bool:  # a principal sees the lines of its own runs only
            return owners.sees_line(who, line)

        self._events_by[key] = mine + 1
        try:
            with bus.subscribe(None if principal.operator else accepts) as subscriber:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_on_websocket_close, receive, nursery.cancel_scope)
                    nursery.start_soon(_cancel_on_event, self.draining, nursery.cancel_scope)
                    nursery.start_soon(_pump_events, subscriber, send)
        finally:
            left = self._events_by.get(key, 1) - 1
            if left:
                self._events_by[key] = left
            else:
                self._events_by.pop(key, None)
        with trio.move_on_after(1.0, shield=True):
            try:
                await send({"type": "websocket.close", "code": 1001 if self.draining.is_set() else 1000})
            except Exception:
                pass  # the peer is gone already

    async def _read_body(self, headers: Mapping[str, str], receive: Receive) -> bytes:
        limit = self.options.max_body
        length = headers.get("content-length")
        declared = int(length) if length is not None and length.isdigit() else None
        if declared is not None and declared > limit:
            raise _TooLarge
        chunks: list[bytes] = []
        size = 0

        def complete(message: Mapping[str, Any]) -> bool:
            """Take one ASGI message; True once the body is whole (or the request is over)."""
            nonlocal size
            if message["type"] != "http.request":
                return True
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
            # the declared length is all there is (the HTTP layer enforces it): no wait for the end
            return not message.get("more_body", False) or size == declared

        # agentd's server's ``receive`` (like a memory channel's) has a ``receive_nowait``: what already arrived
        # (a small body comes with its request) is taken without a timeout scope or a checkpoint; the timed loop
        # waits for the rest.
        take = getattr(getattr(receive, "__self__", None), "receive_nowait", None)
        done = False
        if take is not None:
            try:
                while not done:
                    done = complete(take())
            except trio.WouldBlock:
                pass
        if not done:
            # A bare CancelScope: fail_after's context-manager wrapper is measurable on the hot path.
            with trio.CancelScope(deadline=trio.current_time() + self.options.body_timeout) as scope:
                while not done:
                    done = complete(await receive())
            if scope.cancelled_caught:
                raise trio.TooSlowError
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _dispatch(self, request: Request, ctx: CallContext) -> Response | ErrorResponse:
        """The handler's answer; a bug in it becomes -32603 for this request instead of a 500 for all."""
        if not telemetry.enabled():  # no span to open, no trace context to adopt
            return self._counted(await self._answer(request, ctx), None)
        params = request.params if isinstance(request.params, dict) else None
        meta = params.get("_meta") if params is not None else None
        # The client's trace context in ``_meta`` (the MCP convention) makes this request part of its trace.
        with (telemetry.remote_parent(meta if isinstance(meta, dict) else None),
              mcp_server_span(request.method, params, None) as span):
            span.set_attribute(JSONRPC_REQUEST_ID, str(request.id))
            return self._counted(await self._answer(request, ctx), span)

    async def _answer(self, request: Request, ctx: CallContext) -> Response | ErrorResponse:
        try:
            return await self.handler.handle(request, ctx)
        except Exception as exc:
            self.log.error("serve.request", method=request.method, error=exc.__class__.__name__)
            return ErrorResponse(request.id, jsonrpc.INTERNAL_ERROR, "internal error")

    @staticmethod
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

    def _forget_expired(self) -> None:
        for session_id in self.core.take_expired():
            self._end_session(session_id)

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
        if post.cancels and self.options.accept_cancel:
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
        await _send_reply(send, self.core.legacy_reply(post, answers))

    def _cancellable(self, ctx: CallContext, request: Request) -> CallContext:
        """With ``--serve-accept-cancel``, the request's id goes with it (what it starts can be cancelled by it)."""
        return attrs.evolve(ctx, request_id=request.id) if self.options.accept_cancel else ctx

    async def _legacy_stream(self, stream: LegacyStream, receive: Receive, send: Send) -> None:
        session = stream.session
        sender, receiver = trio.open_memory_channel[tuple[int, bytes]](256)
        self._streams[session.id] = sender
        self.log.debug("serve.session", action="stream_open")

        def closed() -> None:
            if self._streams.get(session.id) is sender:
                del self._streams[session.id]
            self.core.stream_closed(session, trio.current_time())

        async with self._sse(send, receive, ends_on=self.draining, closed=closed) as sse, receiver:
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
            await self._listen(request, headers, receive, send, principal)
            return
        ctx = CallContext(Era.MODERN, cancel_on_disconnect=True, principal=principal)
        if "accept" not in headers or accepts(headers["accept"], EVENT_STREAM):
            opened = self.handler.open_stream(request, ctx)
            if isinstance(opened, ErrorResponse):
                await _send_reply(send, self.core.modern_reply(post, opened))
                return
            if opened is not None:
                await self._notification_stream(opened, receive, send)
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
            await _send_reply(send, self.core.modern_reply(post, await self._dispatch(request, ctx)))
            return
        answers: list[Message] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            answers.append(await self._dispatch(request, ctx))
            nursery.cancel_scope.cancel()
        if answers:
            await _send_reply(send, self.core.modern_reply(post, answers[0]))

    async def _listen(self, request: Request, headers: Mapping[str, str], receive: Receive, send: Send,
                      principal: Principal = LOCAL) -> None:
        if "accept" in headers and not accepts(headers["accept"], EVENT_STREAM):
            await _send_reply(send, error_reply(406, jsonrpc.INVALID_REQUEST,
                                                "subscriptions/listen answers as text/event-stream", id=request.id).http)
            return
        notifications = (request.params or {}).get("notifications") or {}
        wanted = notifications.get("resourceSubscriptions") or [] if isinstance(notifications, dict) else None
        if not isinstance(wanted, list) or not all(isinstance(u, str) for u in wanted):
            await _send_reply(send, error_reply(400, jsonrpc.INVALID_PARAMS, "resourceSubscriptions must be strings",
                                                id=request.id).http)
            return
        task_ids = notifications.get("taskIds") or []
        if not isinstance(task_ids, list) or not all(isinstance(t, str) for t in task_ids):
            await _send_reply(send, error_reply(400, jsonrpc.INVALID_PARAMS, "taskIds must be strings",
                                                id=request.id).http)
            return
        if task_ids and not _declares(request.params or {}, meta.TASKS_EXTENSION):
            await _send_reply(send, error_reply(400, jsonrpc.MISSING_CLIENT_CAPABILITY,
                                                "Missing required client capability", id=request.id,
                                                data={"requiredCapabilities": {"extensions": {
                                                    meta.TASKS_EXTENSION: {}}}}).http)
            return
        if self._listens >= self.options.max_sessions:
            metrics.served_request("refused")
            self.log.info("serve.refused", reason="listen_limit", status=503, limit=self.options.max_sessions)
            await _send_reply(send, error_reply(503, jsonrpc.INTERNAL_ERROR,
                                                f"listen stream limit reached ({self.options.max_sessions})",
                                                id=request.id, headers=(("retry-after", "5"),)).http)
            return
        mine = self._listens_by.get(principal.key, 0)
        if principal.bounded and mine >= self.core.max_per_owner:  # one principal cannot take every stream
            metrics.served_request("refused")
            self.log.info("serve.refused", reason="listen_limit", status=503, limit=self.core.max_per_owner)
            await _send_reply(send, error_reply(503, jsonrpc.INTERNAL_ERROR,
                                                f"listen stream limit reached for this client "
                                                f"({self.core.max_per_owner})",
                                                id=request.id, headers=(("retry-after", "5"),)).http)
            return
        sender, receiver = trio.open_memory_channel[str | dict[str, Any]](256)

        def sink(item: str | dict[str, Any]) -> None:
            try:
                sender.send_nowait(item)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        ticket = self.handler.listen(wanted, sink, principal, task_ids=tuple(task_ids), task_sink=sink)
        core = self.core
        self._listens += 1
        self._listens_by[principal.key] = mine + 1

        def closed() -> None:
            self._listens -= 1
            left = self._listens_by.get(principal.key, 1) - 1
            if left:
                self._listens_by[principal.key] = left
            else:
                self._listens_by.pop(principal.key, None)
            self.handler.unlisten(ticket)

        async with self._sse(send, receive, closed=closed) as sse:
            await sse.send(core.listen_ack(request.id, ticket.honored, ticket.tasks if task_ids else None))
            for uri in ticket.fire_now:
                await sse.send(core.listen_updated(request.id, uri))
            for task in ticket.tasks_now:
                await sse.send(core.listen_task(request.id, task))
            with trio.CancelScope() as until_drain:
                sse.nursery.start_soon(_cancel_on_event, self.draining, until_drain)
                while True:
                    item = await sse.wait(receiver.receive)
                    if isinstance(item, str):
                        await sse.send(core.listen_updated(request.id, item))
                    else:
                        await sse.send(core.listen_task(request.id, item))
            if self.draining.is_set():
                await sse.send(core.listen_final(request.id))

    async def _notification_stream(self, stream: NotificationStream, receive: Receive, send: Send) -> None:
        """Write the handler's frames until the reader goes, the daemon drains (then the final frame) or the
        reader takes no frame within ``SERVE_EVENTS_SEND_TIMEOUT`` (a stalled reader holds nothing more)."""
        stalled = False
        async with self._sse(send, receive, closed=stream.close) as sse:
            with trio.CancelScope() as until_drain:
                sse.nursery.start_soon(_cancel_on_event, self.draining, until_drain)
                while not stalled:
                    frame = await stream.next_frame()
                    with trio.move_on_after(defaults.SERVE_EVENTS_SEND_TIMEOUT):
                        await sse.send(_frame(frame))
                        continue
                    stalled = True
            if stalled:
                self.log.info("serve.stream_ended", reason="reader_stalled",
                              timeout=defaults.SERVE_EVENTS_SEND_TIMEOUT)
            elif self.draining.is_set():
                with trio.move_on_after(1):
                    await sse.send(_frame(stream.final()))

    # -- long answers as SSE -------------------------------------------------------------------------------

    async def _stream_answer(self, send: Send, receive: Receive, answer: Callable[[], Awaitable[Message]],
                             event_id: Callable[[], str | None], extra: tuple[tuple[str, str], ...], *,
                             modern: ModernPost | None = None) -> None:
        """Open SSE at once (priming event on legacy), keep it alive, then send the answer and end.

        A closed stream ends this request. Whether the run it started ends too is the handler's
        call (CallContext.cancel_on_disconnect: modern yes, legacy no)."""
        done: list[Message] = []
        async with self._sse(send, receive, headers=extra) as sse:
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

    # -- the SSE skeleton ----------------------------------------------------------------------------------

    @asynccontextmanager
    async def _sse(self, send: Send, receive: Receive, *, headers: tuple[tuple[str, str], ...] = (),
                   ends_on: trio.Event | None = None,
                   closed: Callable[[], None] | None = None) -> AsyncIterator[_SseStream]:
        """One SSE response: start it, let the body send events (``_SseStream``), then end it.

        A client disconnect (and ``ends_on``, when set) cancels the body. ``closed`` runs however the
        stream ends, before the response body is ended (shielded, bounded) on a normal or cancelled end.
        """
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
                if ends_on is not None:
                    nursery.start_soon(_cancel_on_event, ends_on, nursery.cancel_scope)
                await send(_sse_start(headers))
                yield _SseStream(send, self.options.keepalive, nursery)
                nursery.cancel_scope.cancel()
        finally:
            if closed is not None:
                closed()
        with trio.move_on_after(1) as cleanup:
            cleanup.shield = True
            await _end_body(send)


@attrs.define(eq=False)
class _SseStream:
    """The open body of one SSE response; ``nursery`` is cancelled when the stream ends."""

    _send: Send
    keepalive: float
    nursery: trio.Nursery

    async def send(self, data: bytes) -> None:
        await _body(self._send, data)

    async def wait(self, source: Callable[[], Awaitable[_T]]) -> _T:
        """``await source()`` (which must be safe to cancel and call again), sending a ``: keepalive``
        comment each time ``keepalive`` seconds pass without an answer."""
        while True:
            with trio.move_on_after(self.keepalive):
                return await source()
            await _body(self._send, KEEPALIVE)


def _sse_start(extra: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    headers = [(b"content-type", EVENT_STREAM.encode()), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]
    headers.extend((k.encode(), v.encode()) for k, v in extra)
    return {"type": "http.response.start", "status": 200, "headers": headers}


def _declares(params: Mapping[str, Any], extension: str) -> bool:
    """Does a modern request declare ``extension`` in its per-request client capabilities?"""
    envelope = params.get("_meta")
    caps = envelope.get(meta.CLIENT_CAPABILITIES) if isinstance(envelope, Mapping) else None
    extensions = caps.get("extensions") if isinstance(caps, Mapping) else None
    return isinstance(extensions, Mapping) and isinstance(extensions.get(extension), Mapping)


def _frame(frame: Mapping[str, Any]) -> bytes:
    return encode_event(json.dumps(frame, separators=(",", ":"), ensure_ascii=False, default=str))


async def _body(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _end_body(send: Send) -> None:
    try:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except Exception:  # the peer is gone; nothing left to tell it
        pass


async def _send_reply(send: Send, reply: HttpReply) -> None:
    headers: list[tuple[bytes, bytes]] = []
    if reply.content_type is not None:
        headers.append((b"content-type", reply.content_type.encode()))
    headers.append((b"content-length", str(len(reply.body)).encode()))
    headers.extend((k.encode(), v.encode()) for k, v in reply.headers)
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


async def _pump_events(subscriber: Subscriber, send: Send) -> None:
    """Send the subscriber's lines as they come; a peer that went away ends it (the close watcher reports it)."""
    try:
        while True:
            for line in await subscriber.next_batch():
                await send({"type": "websocket.send", "text": json.dumps(line, default=str)})
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        return


async def _cancel_on_websocket_close(receive: Receive, scope: trio.CancelScope) -> None:
    """Read (and ignore) what the subscriber sends until it closes; then stop its stream."""
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            scope.cancel()
            return


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _cancel_on_event(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


__all__ = ["AsgiOptions", "CallContext", "ListenTicket", "McpAsgiApp", "McpHandler"]
