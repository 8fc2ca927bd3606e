"""The server half of Streamable HTTP, sans-io: which era a request belongs to, sessions, and replies.

One endpoint serves both eras, routed per request the way the official SDK does it: a present
``MCP-Protocol-Version`` that is not a handshake revision sends the request down the *modern*
(2026-07-28) single-exchange path; no header or a handshake revision goes down the *legacy* path with
``initialize``, ``Mcp-Session-Id`` sessions, the GET stream and resumable event ids.

The core answers everything that is protocol (``initialize``, ``ping``, ``server/discover``,
notifications, header and envelope checks) and hands every other request back to the caller as a
:class:`Request` to dispatch; the caller turns the surface's answer into bytes with :meth:`ServerCore.legacy_reply`
or :meth:`ServerCore.modern_reply`. No I/O, no clock: the adapter passes ``now``.
"""

from __future__ import annotations

import collections
import secrets
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from agentd import defaults
from agentd.mcp import jsonrpc, meta
from agentd.mcp.jsonrpc import ErrorResponse, Message, Notification, Request, Response
from agentd.mcp.streamable_http import (
    EVENT_STREAM,
    JSON,
    LAST_EVENT_ID,
    METHOD,
    NAME,
    NAME_PARAM,
    PROTOCOL_VERSION,
    SESSION_ID,
    accepts,
    decode_header_value,
    media_type,
    named_value,
    priming_event,
    sse_message,
)
from agentd.mcp.versions import (
    DEFAULT_HEADERLESS_VERSION,
    LATEST_LEGACY,
    LEGACY_ONLY,
    MODERN_VERSIONS,
    SUPPORTED_VERSIONS,
    Era,
    allows_batches,
    request_era,
    server_pick_legacy,
)

# The request headers the core reads, as ASGI hands them over: lower case.
_SESSION_ID: Final = SESSION_ID.lower()
_PROTOCOL_VERSION: Final = PROTOCOL_VERSION.lower()
_LAST_EVENT_ID: Final = LAST_EVENT_ID.lower()
_METHOD: Final = METHOD.lower()
_NAME: Final = NAME.lower()

#: Results that carry cache hints on the modern wire (``ttlMs`` 0: agent:// state changes under you).
CACHEABLE: Final = frozenset({"server/discover", "tools/list", "resources/list", "resources/templates/list", "resources/read"})
REPLAY_EVENTS: Final = 256


@attrs.frozen
class ServerIdentity:
    """What the server says about itself in ``initialize`` and ``server/discover``."""

    name: str
    version: str
    capabilities: Mapping[str, Any]
    instructions: str | None = None
    #: Said in ``initialize`` instead of ``capabilities`` (an opt-in that exists on the 2025-11-25 wire only).
    legacy_capabilities: Mapping[str, Any] | None = None

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}


@attrs.frozen
class HttpRequest:
    method: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes = b""
    #: Who sends it (agentd.transport.tenancy: a principal's key; "" is a single-principal listener's one
    #: principal). A legacy session belongs to the owner that opened it and is unknown to any other.
    owner: str = ""


@attrs.frozen
class HttpReply:
    status: int
    body: bytes = b""
    content_type: str | None = JSON
    headers: tuple[tuple[str, str], ...] = ()


@attrs.define(eq=False)
class LegacySession:
    """One ``Mcp-Session-Id``: its negotiated version and the GET stream's numbered events."""

    id: str
    version: str
    last_seen: float
    initialized: bool = False
    owner: str = ""
    stream_open: bool = False
    seq: int = 0
    delivered: int = 0
    events: collections.deque[tuple[int, bytes]] = attrs.field(factory=lambda: collections.deque(maxlen=REPLAY_EVENTS))

    def next_id(self) -> int:
        self.seq += 1
        return self.seq


@attrs.frozen
class Reply:
    """Answer now with this."""

    http: HttpReply


@attrs.frozen
class LegacyPost:
    """A legacy POST: ``slots`` holds ready answers and :class:`Request` s the caller must dispatch."""

    session: LegacySession
    slots: tuple[Message | None, ...]
    batch: bool
    new_session: bool
    #: The request ids its ``notifications/cancelled`` name (acted on only with ``--serve-accept-cancel``).
    cancels: tuple[jsonrpc.RequestId, ...] = ()


@attrs.frozen
class LegacyStream:
    """A GET: open the session's SSE stream, send ``replay`` (already encoded) after the priming event."""

    session: LegacySession
    priming: bytes
    replay: tuple[tuple[int, bytes], ...]


@attrs.frozen
class ModernPost:
    """A modern request the caller must dispatch (``subscriptions/listen`` answers as an SSE stream)."""

    request: Request
    version: str


Routed = Reply | LegacyPost | LegacyStream | ModernPost


#: A legacy session nobody used for this long is dropped (its client gets 404 and starts a new one).
SESSION_IDLE: Final = 300.0
#: When the table is full, the idlest session idle at least this long makes room for a new one.
SESSION_EVICT_AFTER: Final = 30.0
#: Messages in one JSON-RPC batch; a longer batch is refused whole.
MAX_BATCH: Final = 128


def per_owner_sessions(max_sessions: int) -> int:
    """Sessions one owner may hold of ``max_sessions``: a quarter, so a client that keeps its sessions alive
    (pings count as use) leaves three quarters to everyone else."""
    return max(1, max_sessions // defaults.SERVE_SESSIONS_PER_OWNER_DIVISOR)


class SessionLimit(Exception):
    """No room for another session even after expiring idle ones."""


def _error_body(code: int, message: str, id: jsonrpc.RequestId | None = None, data: Any = None) -> bytes:
    return jsonrpc.dumps(ErrorResponse(id, code, message, data))


def error_reply(status: int, code: int, message: str, *, id: jsonrpc.RequestId | None = None, data: Any = None,
                headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(HttpReply(status, _error_body(code, message, id, data), headers=headers))


class ServerCore:
    """Routes requests to an era, keeps legacy sessions, and renders replies."""

    def __init__(
        self,
        identity: ServerIdentity,
        *,
        max_sessions: int = defaults.SERVE_MAX_SESSIONS,
        max_per_owner: int | None = None,
        session_idle: float = SESSION_IDLE,
        evict_after: float = SESSION_EVICT_AFTER,
        retry_ms: int = 2000,
        new_session_id: Callable[[], str] = lambda: secrets.token_hex(16),
    ) -> None:
        self.identity = identity
        self.max_sessions = max_sessions
        #: Sessions one owner (not "") may hold at once, so one client cannot take every session
        #: (default: :func:`per_owner_sessions` of ``max_sessions``).
        self.max_per_owner = per_owner_sessions(max_sessions) if max_per_owner is None else max_per_owner
        self.session_idle = session_idle
        self.evict_after = evict_after
        self.retry_ms = retry_ms
        self._new_id = new_session_id
        self.sessions: dict[str, LegacySession] = {}
        #: Ids of sessions expired for idleness since the last :meth:`take_expired` (their state elsewhere
        #: -- subscriptions, stream channels -- is the caller's to drop).
        self.expired: list[str] = []

    # -- routing -----------------------------------------------------------------------------------------

    def route(self, req: HttpRequest, now: float) -> Routed:
        version = req.headers.get(_PROTOCOL_VERSION)
        if version is not None and request_era(version) is Era.MODERN:
            return self._route_modern(req, version)
        if req.method == "POST":
            return self._route_legacy_post(req, version, now)
        if req.method == "GET":
            return self._route_get(req, version, now)
        if req.method == "DELETE":
            return self._route_delete(req)
        return Reply(HttpReply(405, b"", None, (("allow", "GET, POST, DELETE"),)))

    def _session_for(self, req: HttpRequest, version: str | None, now: float) -> LegacySession | Reply:
        sid = req.headers.get(_SESSION_ID)
        if sid is None:
            return error_reply(400, jsonrpc.INVALID_REQUEST, "Bad Request: Missing session ID")
        session = self.sessions.get(sid)
        if session is None or session.owner != req.owner:  # another owner's session is as unknown as none
            return error_reply(404, jsonrpc.INVALID_REQUEST, "Session not found")
        session.last_seen = now
        return session

    def _route_legacy_post(self, req: HttpRequest, version: str | None, now: float) -> Routed:
        accept = req.headers.get("accept")
        if not (accepts(accept, JSON) and accepts(accept, EVENT_STREAM)):
            return error_reply(406, jsonrpc.INVALID_REQUEST,
                               "Not Acceptable: Accept must list application/json and text/event-stream")
        if media_type(req.headers.get("content-type", JSON)) != JSON:
            return error_reply(415, jsonrpc.INVALID_REQUEST, "Unsupported Media Type: send application/json")
        try:
            parsed = jsonrpc.parse_body(req.body)
        except jsonrpc.InvalidMessage as exc:
            return Reply(HttpReply(400, jsonrpc.dumps(jsonrpc.error_for(exc))))
        if isinstance(parsed, list) and len(parsed) > MAX_BATCH:
            return error_reply(400, jsonrpc.INVALID_REQUEST,
                               f"a batch of {len(parsed)} messages exceeds the limit of {MAX_BATCH}")
        messages = parsed if isinstance(parsed, list) else [parsed]
        is_init = any(isinstance(m, Request) and m.method == "initialize" for m in messages)
        if is_init:
            if isinstance(parsed, list):
                return error_reply(400, jsonrpc.INVALID_REQUEST, "initialize must not be part of a batch")
            assert isinstance(parsed, Request)
            return self._initialize(parsed, now, req.owner)
        found = self._session_for(req, version, now)
        if isinstance(found, Reply):
            return found
        session = found
        effective = version or session.version
        if isinstance(parsed, list) and not (allows_batches(effective) and allows_batches(session.version)):
            return error_reply(400, jsonrpc.INVALID_REQUEST, "JSON-RPC batches are only accepted from 2025-03-26 peers")
        slots: list[Message | None] = []
        cancels: list[jsonrpc.RequestId] = []
        for message in messages:
            slots.append(self._legacy_protocol(message, session))
            if isinstance(message, Notification) and message.method == "notifications/cancelled":
                named = (message.params or {}).get("requestId")
                if isinstance(named, (str, int)) and not isinstance(named, bool):
                    cancels.append(named)
        return LegacyPost(session, tuple(slots), isinstance(parsed, list), False, tuple(cancels))

    def _legacy_protocol(self, message: Message, session: LegacySession) -> Message | None:
        """Answer what the protocol answers; return the request itself when the surface must."""
        if isinstance(message, Notification):
            if message.method == "notifications/initialized":
                session.initialized = True
            return None  # notifications/cancelled included: the POST lists what it names (LegacyPost.cancels)
        if isinstance(message, Response | ErrorResponse):
            return None  # the server sends no requests, so there is nothing to match
        if message.method == "ping":
            return Response(message.id, {})
        return message

    def _initialize(self, request: Request, now: float, owner: str = "") -> Routed:
        params = request.params or {}
        requested = params.get("protocolVersion")
        if not isinstance(requested, str):
            return Reply(HttpReply(400, _error_body(jsonrpc.INVALID_PARAMS, "initialize needs a protocolVersion",
                                                   request.id)))
        if owner and self.owned(owner) >= self.max_per_owner and not self._evict_own(owner, now):
            return error_reply(503, jsonrpc.INTERNAL_ERROR,
                               f"session limit reached for this client ({self.max_per_owner}); "
                               "end a session with DELETE", id=request.id, headers=(("retry-after", "5"),))
        try:
            self._make_room(now)
        except SessionLimit:
            return error_reply(503, jsonrpc.INTERNAL_ERROR,
                               f"session limit reached ({self.max_sessions}); end a session with DELETE",
                               id=request.id, headers=(("retry-after", "5"),))
        version = server_pick_legacy(requested)
        session = LegacySession(self._new_id(), version, now, owner=owner)
        self.sessions[session.id] = session
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": dict(self.identity.capabilities if self.identity.legacy_capabilities is None
                                 else self.identity.legacy_capabilities),
            "serverInfo": self.identity.info(),
        }
        if self.identity.instructions:
            result["instructions"] = self.identity.instructions
        return LegacyPost(session, (Response(request.id, result),), False, True)

    def owned(self, owner: str) -> int:
        """Sessions ``owner`` holds now."""
        return sum(1 for s in self.sessions.values() if s.owner == owner)

    def _evict_own(self, owner: str, now: float) -> bool:
        """An owner at its cap: its own idlest session (no open stream, idle ``evict_after``) makes room."""
        idle = [s for s in self.sessions.values() if s.owner == owner and not s.stream_open]
        if not idle:
            return False
        oldest = min(idle, key=lambda s: s.last_seen)
        if now - oldest.last_seen < self.evict_after:
            return False
        del self.sessions[oldest.id]
        self.expired.append(oldest.id)
        return True

    def _make_room(self, now: float) -> None:
        if len(self.sessions) < self.max_sessions:
            return
        idle = sorted(
            (s for s in self.sessions.values() if not s.stream_open), key=lambda s: s.last_seen
        )
        for session in idle:
            if now - session.last_seen >= self.session_idle:
                del self.sessions[session.id]
                self.expired.append(session.id)
        if len(self.sessions) < self.max_sessions:
            return
        # still full: the idlest session makes room, if it has been idle a while (abandoned sessions must not
        # lock new clients out until they expire; busy ones are never taken)
        idle = [s for s in idle if s.id in self.sessions]
        if idle and now - idle[0].last_seen >= self.evict_after:
            del self.sessions[idle[0].id]
            self.expired.append(idle[0].id)
            return
        raise SessionLimit

    def expire_idle(self, now: float) -> list[str]:
        """Drop sessions idle past ``session_idle`` (none with an open stream); returns their ids."""
        gone = [s.id for s in self.sessions.values() if not s.stream_open and now - s.last_seen >= self.session_idle]
        for sid in gone:
            del self.sessions[sid]
        self.expired.extend(gone)
        return gone

    def take_expired(self) -> list[str]:
        gone, self.expired = self.expired, []
        return gone

    def _route_get(self, req: HttpRequest, version: str | None, now: float) -> Routed:
        accept = req.headers.get("accept")
        if accept is None or not accepts(accept, EVENT_STREAM):
            return error_reply(406, jsonrpc.INVALID_REQUEST, "Not Acceptable: GET needs Accept: text/event-stream")
        found = self._session_for(req, version, now)
        if isinstance(found, Reply):
            return found
        session = found
        if session.stream_open:
            return error_reply(409, jsonrpc.INVALID_REQUEST, "Conflict: this session's GET stream is already open")
        after = session.delivered
        last = req.headers.get(_LAST_EVENT_ID)
        if last is not None:
            try:
                after = int(last)
            except ValueError:
                after = session.delivered
        replay = tuple((seq, data) for seq, data in session.events if seq > after)
        session.stream_open = True
        priming = priming_event(str(session.next_id()), self.retry_ms)
        return LegacyStream(session, priming, replay)

    def _route_delete(self, req: HttpRequest) -> Routed:
        sid = req.headers.get(_SESSION_ID)
        if sid is None:
            return error_reply(400, jsonrpc.INVALID_REQUEST, "Bad Request: Missing session ID")
        session = self.sessions.get(sid)
        if session is None or session.owner != req.owner:
            return error_reply(404, jsonrpc.INVALID_REQUEST, "Session not found")
        del self.sessions[sid]
        return Reply(HttpReply(200, b"", None))

    # -- legacy replies and the GET stream ---------------------------------------------------------------

    def legacy_reply(self, post: LegacyPost, answers: Mapping[int, Message]) -> HttpReply:
        """Render the POST's answer: 202 when it carried no request, else JSON (one object or a batch)."""
        out: list[Message] = []
        for index, slot in enumerate(post.slots):
            if isinstance(slot, Request):
                out.append(answers[index])
            elif slot is not None:
                out.append(slot)
        headers = session_headers(post)
        if not out:
            return HttpReply(202, b"", None, headers)
        body = jsonrpc.dumps(out if post.batch else out[0])
        return HttpReply(200, body, JSON, headers)

    def session_event(self, session: LegacySession, message: Message) -> tuple[int, bytes]:
        """Number and buffer one server→client message for the session's GET stream (replayable)."""
        seq = session.next_id()
        data = sse_message(message, id=str(seq))
        session.events.append((seq, data))
        return seq, data

    def delivered(self, session: LegacySession, seq: int) -> None:
        session.delivered = max(session.delivered, seq)

    def stream_closed(self, session: LegacySession, now: float) -> None:
        session.stream_open = False
        session.last_seen = now

    # -- modern --------------------------------------------------------------------------------------------

    def _route_modern(self, req: HttpRequest, header_version: str) -> Routed:
        if req.method != "POST":
            return Reply(HttpReply(405, b"", None, (("allow", "POST"),)))
        try:
            parsed = jsonrpc.parse_body(req.body)
        except jsonrpc.InvalidMessage as exc:
            return Reply(HttpReply(400, jsonrpc.dumps(jsonrpc.error_for(exc))))
        if isinstance(parsed, list):
            return error_reply(400, jsonrpc.INVALID_REQUEST, "batches do not exist in 2026-07-28")
        if isinstance(parsed, Response | ErrorResponse):
            return Reply(HttpReply(202, b"", None))
        params = parsed.params or {}
        rid = parsed.id if isinstance(parsed, Request) else None
        meta_version = meta.envelope_version(params)
        if meta_version is None:
            return error_reply(400, jsonrpc.INVALID_PARAMS,
                               "params._meta must carry protocolVersion and clientCapabilities", id=rid)
        if req.headers.get(_METHOD) != parsed.method:
            return error_reply(400, jsonrpc.HEADER_MISMATCH, "Mcp-Method header does not match the method", id=rid)
        if parsed.method in NAME_PARAM:
            got = req.headers.get(_NAME)
            if got is None or decode_header_value(got) != named_value(parsed.method, params):
                return error_reply(400, jsonrpc.HEADER_MISMATCH, "Mcp-Name header does not match the request", id=rid)
        if meta_version != header_version:
            return error_reply(400, jsonrpc.HEADER_MISMATCH,
                               "MCP-Protocol-Version header does not match params._meta", id=rid)
        if header_version not in MODERN_VERSIONS:
            return error_reply(400, jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version", id=rid,
                               data={"supported": list(SUPPORTED_VERSIONS), "requested": header_version})
        if isinstance(parsed, Notification):
            return Reply(HttpReply(202, b"", None))
        if parsed.method in LEGACY_ONLY:  # initialize too: it is served on the legacy wire only
            return error_reply(404, jsonrpc.METHOD_NOT_FOUND, f"{parsed.method} does not exist in {header_version}",
                               id=rid)
        if parsed.method == "server/discover":
            return Reply(self.modern_reply(ModernPost(parsed, header_version), Response(parsed.id, self.discover())))
        return ModernPost(parsed, header_version)

    def discover(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": dict(self.identity.capabilities),
        }
        if self.identity.instructions:
            result["instructions"] = self.identity.instructions
        return result

    def modern_result(self, method: str, result: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(result)
        # A task (the tasks extension, SEP-2663) says so itself; every other answer is complete.
        out["resultType"] = "task" if result.get("resultType") == "task" else "complete"
        out["_meta"] = {**(out.get("_meta") or {}), meta.SERVER_INFO: self.identity.info()}
        if method in CACHEABLE:
            out.setdefault("ttlMs", 0)
            out.setdefault("cacheScope", "private")
        return out

    def modern_reply(self, post: ModernPost, answer: Message) -> HttpReply:
        if isinstance(answer, Response):
            body = jsonrpc.dumps(Response(answer.id, self.modern_result(post.request.method, answer.result)))
            return HttpReply(200, body)
        assert isinstance(answer, ErrorResponse)
        code, data = answer.code, answer.data
        if code == jsonrpc.RESOURCE_NOT_FOUND:
            code = jsonrpc.INVALID_PARAMS  # 2026-07-28 moved resource-not-found to -32602
        status = 404 if code == jsonrpc.METHOD_NOT_FOUND else 200
        return HttpReply(status, jsonrpc.dumps(ErrorResponse(answer.id, code, answer.message, data)))

    # -- subscriptions/listen frames -------------------------------------------------------------------------

    @staticmethod
    def listen_ack(request_id: jsonrpc.RequestId, honored: list[str], tasks: list[str] | None = None) -> bytes:
        """The acknowledgement: the URIs honored, and (when task ids were asked for) the task ids the server agreed
        to send ``notifications/tasks`` for (the tasks extension, SEP-2663)."""
        notifications: dict[str, Any] = {}
        if honored:
            notifications["resourceSubscriptions"] = honored
        if tasks is not None:
            notifications["taskIds"] = tasks
        note = Notification("notifications/subscriptions/acknowledged",
                            {"_meta": meta.subscription_meta(request_id), "notifications": notifications})
        return sse_message(note)

    @staticmethod
    def listen_updated(request_id: jsonrpc.RequestId, uri: str) -> bytes:
        note = Notification("notifications/resources/updated", {"_meta": meta.subscription_meta(request_id), "uri": uri})
        return sse_message(note)

    @staticmethod
    def listen_task(request_id: jsonrpc.RequestId, task: dict[str, Any]) -> bytes:
        """``notifications/tasks``: one task's complete current state, as ``tasks/get`` answers it."""
        return sse_message(Notification("notifications/tasks", {**task, "_meta": meta.subscription_meta(request_id)}))

    @staticmethod
    def listen_final(request_id: jsonrpc.RequestId) -> bytes:
        done = Response(request_id, {"resultType": "complete", "_meta": meta.subscription_meta(request_id)})
        return sse_message(done)


def session_headers(post: LegacyPost) -> tuple[tuple[str, str], ...]:
    """The response header that hands a new session its id (only on the ``initialize`` answer)."""
    return ((_SESSION_ID, post.session.id),) if post.new_session else ()


def updated_notification(uri: str) -> Notification:
    return Notification("notifications/resources/updated", {"uri": uri})


__all__ = [
    "DEFAULT_HEADERLESS_VERSION",
    "LATEST_LEGACY",
    "HttpReply",
    "HttpRequest",
    "LegacyPost",
    "LegacySession",
    "LegacyStream",
    "ModernPost",
    "Reply",
    "ServerCore",
    "ServerIdentity",
    "decode_header_value",
    "error_reply",
    "session_headers",
    "updated_notification",
]
