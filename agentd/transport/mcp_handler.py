"""What the MCP endpoint (agentd.transport.mcp_app) asks of the server behind it: the handler's side of the seam.

The endpoint knows HTTP, sessions and streams, and no tool names; the handler (agentd's self-MCP surface, or
any other) answers requests, says which ones to answer as SSE, and keeps ``subscriptions/listen`` lists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

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
    #: Modern wire: a closed response stream cancels the request (and what it started).
    cancel_on_disconnect: bool = False
    #: Who is calling (agentd.transport.tenancy): what it creates is its own, and it sees only that.
    principal: Principal = LOCAL
    #: Legacy wire with ``--serve-accept-cancel``: this request's id, which a ``notifications/cancelled`` of its
    #: session may name (None: nothing can cancel it that way).
    request_id: jsonrpc.RequestId | None = None


@attrs.define(eq=False)
class ListenTicket:
    """One ``subscriptions/listen`` stream as the handler sees it."""

    honored: list[str]
    fire_now: list[str]


class McpHandler(Protocol):
    identity: ServerIdentity

    async def handle(self, request: Request, ctx: CallContext) -> Response | ErrorResponse: ...

    def streams(self, request: Request) -> bool:
        """Whether to answer ``request`` as SSE (when the peer accepts it) so keepalives flow while it runs."""
        ...

    def listen(self, uris: list[str], sink: Callable[[str], None], principal: Principal = LOCAL) -> ListenTicket: ...

    def unlisten(self, ticket: ListenTicket) -> None: ...

    def session_closed(self, session_id: str) -> None: ...


__all__ = ["CallContext", "ListenTicket", "McpHandler"]
