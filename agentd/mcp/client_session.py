"""The MCP client session as a sans-io state machine: messages in, decisions out, no I/O.

Theory of operation. A session starts ``NEW``. :meth:`ClientSession.start_initialize` builds the one
``initialize`` request (2025-11-25, ``capabilities: {}``, ``clientInfo`` without title) and moves to
``INITIALIZING``. Its answer goes to :meth:`complete_initialize` (accepting the four legacy revisions,
freezing the capabilities) or, when the server refused it, to :meth:`modern_refusal`, which says whether
the refusal came from a handshake-less 2026-07-28 server; then :meth:`adopt_modern` takes that server's
``server/discover`` result instead. Either way the session is ``READY`` and its era is fixed.

:meth:`request` allocates ids, records the pending method and applies the era's rules: the legacy wire
refuses modern-only methods; the modern wire wraps every request in the ``_meta`` envelope (its client
capabilities: the tasks extension on ``tools/call`` and ``tasks/*``, agentd.mcp.meta) and refuses
``ping``, ``resources/subscribe`` and friends. Subscribing without the advertised capability raises
:class:`CapabilityMissing`, so the caller degrades instead of sending it.

:meth:`receive` takes any parsed message and returns the events it causes: a response or error for a
pending request, the answer to a server-to-client request (``ping`` → ``{}``, ``roots/list`` →
``{"roots": []}``, anything else → -32601), or a notification to route. A host may opt one server in to client
capabilities (``elicitation``, ``sampling``: :attr:`ClientSession.declared`); only then does the handshake
declare them (and the modern wire's per-request capabilities), and only then is such a request handed to
the caller to answer (:class:`ServerRequestReceived`) instead of refused. :meth:`cancel` says what to send
when a request is abandoned: ``notifications/cancelled`` on the legacy wire, nothing for ``initialize`` or
on the modern wire (there, closing the response stream is the cancellation).
"""

from __future__ import annotations

import enum
import itertools
from typing import Any

import attrs

from agentd.mcp import jsonrpc, meta, types
from agentd.mcp.jsonrpc import ErrorResponse, Message, Notification, Request, RequestId, Response
from agentd.mcp.versions import (
    LATEST_LEGACY,
    LATEST_MODERN,
    LEGACY_ONLY,
    LEGACY_VERSIONS,
    MODERN_ONLY,
    MODERN_VERSIONS,
    Era,
)

#: The server-to-client requests a host may opt a server in to, by the capability that declares them.
_DECLARABLE = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling"}


def no_roots() -> dict[str, Any]:
    """agentd's answer to ``roots/list``, on the legacy wire and as a modern input response: it exposes none."""
    return {"roots": []}


class State(enum.Enum):
    NEW = "new"
    INITIALIZING = "initializing"
    READY = "ready"
    CLOSED = "closed"


class SessionError(Exception):
    """The caller asked for something the session's state or era does not allow."""


class CapabilityMissing(SessionError):
    """The server did not advertise the capability a request needs; degrade instead of sending it."""


class HandshakeError(SessionError):
    """The server's answer to the handshake is unusable (unknown version, malformed result)."""


class ResultTypeError(SessionError):
    """A modern result whose ``resultType`` agentd cannot act on."""


@attrs.frozen
class ResponseReceived:
    id: RequestId
    method: str
    result: dict[str, Any]


@attrs.frozen
class ErrorReceived:
    id: RequestId
    method: str
    error: ErrorResponse


@attrs.frozen
class ServerRequestAnswered:
    """The server asked us something; ``reply`` must be sent back (POSTed on HTTP)."""

    request: Request
    reply: Response | ErrorResponse


@attrs.frozen
class ServerRequestReceived:
    """The server asked for something this session declared (elicitation, sampling): the caller answers it
    (:meth:`ClientSession.answer` builds the reply) and sends the reply back."""

    request: Request


@attrs.frozen
class NotificationReceived:
    method: str
    params: dict[str, Any]


@attrs.frozen
class Unexpected:
    """A response for no pending request, or an error without an id: logged, otherwise ignored."""

    message: Message


Event = ResponseReceived | ErrorReceived | ServerRequestAnswered | ServerRequestReceived | NotificationReceived | Unexpected


def is_modern_refusal(error: ErrorResponse) -> bool:
    """Does this answer to ``initialize`` come from a handshake-less (2026-07-28) server?

    -32022 with ``data.supported`` naming a modern revision is certain; -32020 exists only on the modern
    wire; -32602 is what a modern server says about a request without the ``_meta`` envelope, and a
    legacy server has no reason to say it to a well-formed ``initialize``. The caller confirms the last
    two with ``server/discover`` before switching.
    """
    if error.code == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION:
        supported = error.data.get("supported") if isinstance(error.data, dict) else None
        return isinstance(supported, list) and any(v in MODERN_VERSIONS for v in supported)
    return error.code in (jsonrpc.HEADER_MISMATCH, jsonrpc.INVALID_PARAMS)


def result_type(result: dict[str, Any]) -> str:
    """Check a modern result's ``resultType``: absent means complete; anything but complete raises (an
    ``input_required`` answer to a call is followed up by :mod:`agentd.mcp.input_required` instead)."""
    kind = result.get("resultType", "complete")
    if kind == "complete":
        return "complete"
    if kind == "input_required":
        raise ResultTypeError("the server asked for input (input_required); agentd declares no client capabilities")
    raise ResultTypeError(f"unknown resultType {kind!r}")


@attrs.define(eq=False)
class ClientSession:
    """One logical MCP session with one server. Re-create it (or :meth:`reset`) to reconnect."""

    client_info: types.Implementation
    state: State = State.NEW
    era: Era | None = None
    protocol_version: str | None = None
    initialize_result: types.InitializeResult | None = None
    discover_result: types.DiscoverResult | None = None
    #: Frozen at the end of the handshake; gates every later request.
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    pending: dict[RequestId, str] = attrs.field(factory=dict)
    #: The client capabilities the host opted this server in to (``elicitation``, ``sampling``); empty (the
    #: default): the handshake declares ``capabilities: {}`` and both requests are refused with -32601.
    declared: tuple[str, ...] = ()
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    _initialize_id: RequestId | None = None

    # -- handshake -------------------------------------------------------------------------------------

    def start_initialize(self) -> Request:
        if self.state is not State.NEW:
            raise SessionError(f"initialize in state {self.state.value}")
        self.state = State.INITIALIZING
        request = self._new_request(
            "initialize",
            {
                "protocolVersion": LATEST_LEGACY,
                "capabilities": self.declared_capabilities(),
                "clientInfo": self._wire_info(),
            },
        )
        self._initialize_id = request.id
        return request

    def complete_initialize(self, result: dict[str, Any]) -> types.InitializeResult:
        if self.state is not State.INITIALIZING:
            raise SessionError(f"an initialize result in state {self.state.value}")
        self._forget(self._initialize_id)
        try:
            init = types.structure(result, types.InitializeResult)
        except types.WireError as exc:
            raise HandshakeError(f"malformed initialize result: {exc}") from None
        if init.protocol_version not in LEGACY_VERSIONS:
            raise HandshakeError(f"the server chose protocol version {init.protocol_version!r}, which agentd does not speak")
        self.initialize_result = init
        self.protocol_version = init.protocol_version
        self.capabilities = init.capabilities
        self.era = Era.LEGACY
        self.state = State.READY
        return init

    def initialized_notification(self) -> Notification:
        return Notification("notifications/initialized")

    def modern_refusal(self, error: ErrorResponse) -> bool:
        """Record a refused ``initialize``; True when the refusal points at a modern-only server."""
        self._forget(self._initialize_id)
        return is_modern_refusal(error)

    def start_discover(self) -> Request:
        """``server/discover`` at 2026-07-28, sent after a modern refusal (or as a probe)."""
        if self.state is State.READY:
            raise SessionError("discover after the session is ready")
        self.state = State.INITIALIZING
        request = self._new_request("server/discover", self._envelope({}, LATEST_MODERN))
        self._initialize_id = request.id
        return request

    def adopt_modern(self, result: dict[str, Any]) -> types.DiscoverResult:
        self._forget(self._initialize_id)
        try:
            result_type(result)
            found = types.structure(result, types.DiscoverResult)
        except (types.WireError, ResultTypeError) as exc:
            raise HandshakeError(f"malformed server/discover result: {exc}") from None
        mutual = [v for v in found.supported_versions if v in MODERN_VERSIONS]
        if not mutual:
            raise HandshakeError(f"the server supports {found.supported_versions!r}, none of which agentd speaks")
        self.discover_result = found
        self.protocol_version = mutual[0]
        self.capabilities = found.capabilities
        self.era = Era.MODERN
        self.state = State.READY
        return found

    # -- requests ----------------------------------------------------------------------------------------

    def request(self, method: str, params: dict[str, Any] | None = None) -> Request:
        if self.state is not State.READY:
            raise SessionError(f"{method} before the session is ready")
        if method == "initialize":
            raise SessionError("initialize is sent by start_initialize only")
        if self.era is Era.LEGACY and method in MODERN_ONLY:
            raise SessionError(f"{method} does not exist on the legacy wire")
        if self.era is Era.MODERN and method in LEGACY_ONLY:
            raise SessionError(f"{method} does not exist on the 2026-07-28 wire")
        if method in ("resources/subscribe", "resources/unsubscribe") and not self.can_subscribe():
            raise CapabilityMissing("the server did not advertise resources.subscribe")
        if self.era is Era.MODERN:
            assert self.protocol_version is not None
            params = self._envelope(dict(params or {}), self.protocol_version, method)
        return self._new_request(method, params)

    def notification(self, method: str, params: dict[str, Any] | None = None) -> Notification:
        return Notification(method, params)

    def cancel(self, request_id: RequestId, reason: str) -> Notification | None:
        """Forget an abandoned request; return the ``notifications/cancelled`` to send, if any."""
        method = self.pending.pop(request_id, None)
        if method is None or method == "initialize" or self.era is Era.MODERN:
            return None
        return Notification("notifications/cancelled", {"requestId": request_id, "reason": reason})

    def reset(self) -> None:
        """Back to ``NEW`` for a reconnect. Ids keep counting so late answers cannot be confused."""
        self.state = State.NEW
        self.era = None
        self.protocol_version = None
        self.initialize_result = None
        self.discover_result = None
        self.capabilities = {}
        self.pending.clear()
        self._initialize_id = None

    # -- capabilities ----------------------------------------------------------------------------------

    def _capability(self, group: str, flag: str) -> bool:
        section = self.capabilities.get(group)
        return isinstance(section, dict) and section.get(flag) is True

    def can_subscribe(self) -> bool:
        return self._capability("resources", "subscribe")

    def tools_list_changed(self) -> bool:
        return self._capability("tools", "listChanged")

    def resources_list_changed(self) -> bool:
        return self._capability("resources", "listChanged")

    def tools_idempotency(self) -> bool:
        """The server declares the proposed standard idempotency field (``capabilities.tools.idempotency``,
        SEP-3182: ``true`` or an object); agentd then sends ``params.idempotencyKey`` beside its ``_meta`` key."""
        section = self.capabilities.get("tools")
        return isinstance(section, dict) and (section.get("idempotency") is True
                                              or isinstance(section.get("idempotency"), dict))

    def has(self, group: str) -> bool:
        return isinstance(self.capabilities.get(group), dict)

    # -- inbound ---------------------------------------------------------------------------------------

    def receive(self, message: Message) -> Event:
        if isinstance(message, Response):
            method = self.pending.pop(message.id, None)
            if method is None:
                return Unexpected(message)
            return ResponseReceived(message.id, method, message.result)
        if isinstance(message, ErrorResponse):
            if message.id is None:
                return Unexpected(message)
            method = self.pending.pop(message.id, None)
            if method is None:
                return Unexpected(message)
            return ErrorReceived(message.id, method, message)
        if isinstance(message, Request):
            if self.declares(message.method):
                return ServerRequestReceived(message)
            return ServerRequestAnswered(message, self._answer(message))
        return NotificationReceived(message.method, message.params or {})

    def declares(self, method: str) -> bool:
        """Whether a server's ``method`` (``elicitation/create``, ``sampling/createMessage``) is one this session
        declared the capability for, so the caller answers it."""
        capability = _DECLARABLE.get(method)
        return capability is not None and capability in self.declared

    def declared_capabilities(self) -> dict[str, Any]:
        """The client capabilities this session declares: ``{}`` unless the host opted the server in."""
        return meta.declared_object(self.declared)

    @staticmethod
    def answer(request: Request, result: dict[str, Any] | None, error: tuple[int, str] | None = None
               ) -> Response | ErrorResponse:
        """The reply to a :class:`ServerRequestReceived`: its ``result``, or ``error`` (code, message)."""
        if error is not None or result is None:
            code, text = error or (jsonrpc.INTERNAL_ERROR, "no answer")
            return ErrorResponse(request.id, code, text)
        return Response(request.id, result)

    def _answer(self, request: Request) -> Response | ErrorResponse:
        if request.method == "ping":
            return Response(request.id, {})
        if request.method == "roots/list":
            return Response(request.id, no_roots())
        return ErrorResponse(request.id, jsonrpc.METHOD_NOT_FOUND, f"method not found: {request.method}")

    # -- helpers ---------------------------------------------------------------------------------------

    def _new_request(self, method: str, params: dict[str, Any] | None) -> Request:
        request_id = next(self._ids)
        self.pending[request_id] = method
        return Request(request_id, method, params)

    def _forget(self, request_id: RequestId | None) -> None:
        if request_id is not None:
            self.pending.pop(request_id, None)

    def _wire_info(self) -> dict[str, str]:
        """``clientInfo`` as agentd sends it: name and version, no title."""
        return {"name": self.client_info.name, "version": self.client_info.version}

    def _envelope(self, params: dict[str, Any], version: str, method: str | None = None) -> dict[str, Any]:
        return meta.with_envelope(params, version, self._wire_info(), method, self.declared)
