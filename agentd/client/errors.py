"""Client-side refinements of :mod:`agentd.errors` (all subclasses, so existing handlers keep working)."""

from __future__ import annotations

from agentd.errors import McpTransportError
from agentd.mcp.jsonrpc import RequestId


class ResponseStreamBroken(McpTransportError):
    """A 2026-07-28 response stream broke (reset, or closed) before its answer; there is no resumability.

    ``reissued`` says whether the request was sent again under a new id (only side-effect-free requests
    are); for ``tools/call`` it is False: the call was not re-sent and may or may not have run.
    """

    def __init__(
        self, message: str, *, server: str | None, method: str, request_id: RequestId, reissued: bool
    ) -> None:
        super().__init__(message, server=server)
        self.method = method
        self.request_id = request_id
        self.reissued = reissued
