"""What the MCP endpoint (agentd.transport.mcp_app) asks of the server behind it: the handler's side of the seam.

The endpoint knows HTTP, sessions and streams, and no tool names; the handler (agentd's self-MCP surface, or
any other) answers requests, says which ones to answer as SSE or as a stream of its own frames, and keeps
``subscriptions/listen`` lists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs

from agentd.mcp import jsonrpc
from agentd.mcp.jsonrpc import ErrorResponse, Request, Response
from agentd.mcp.server_session import ServerIdentity
from agentd.mcp.versions import Era
from agentd.transport.tenancy import LOCAL, Principal


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


__all__ = ["CallContext", "ListenTicket", "McpHandler", "NotificationStream"]
