"""The OAuth protected-resource metadata (RFC 9728), served with ``--serve-oauth-issuer`` at both of its forms:
``/.well-known/oauth-protected-resource`` and ``/.well-known/oauth-protected-resource<path>`` for the served path
(:attr:`ResourceServer.metadata_paths`, which the bound port may change: the app is mounted on the well-known
path and every path under it, and answers 404 for the ones that are not the metadata's).

Without a token (a client reads it to learn where to get one: the 401's ``resource_metadata`` names it), but
behind the listener's Host/Origin check like every other path; ``GET`` only (405 otherwise), cacheable for
five minutes.
"""

from __future__ import annotations

from typing import Final

from agentd.mcp.server_session import HttpReply
from agentd.transport.asgi import Receive, Scope, Send, not_found, request_headers, send_reply
from agentd.transport.gate import Gate
from agentd.transport.resource_server import WELL_KNOWN, ResourceServer

#: Where it is mounted (with every path under it).
PATH: Final = WELL_KNOWN
CACHE: Final = ("cache-control", "max-age=300")
METHOD_NOT_ALLOWED: Final = HttpReply(405, b"method not allowed", "text/plain", headers=(("allow", "GET"),))


class ResourceMetadataApp:
    def __init__(self, oauth: ResourceServer, gate: Gate) -> None:
        self.oauth = oauth
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] not in self.oauth.metadata_paths:
            await not_found(scope, receive, send)
            return
        refusal = self.gate.trust(request_headers(scope))
        if refusal is None and scope["method"] != "GET":
            refusal = METHOD_NOT_ALLOWED
        await send_reply(send, refusal or HttpReply(200, self.oauth.metadata(), "application/json", headers=(CACHE,)))


__all__ = ["PATH", "ResourceMetadataApp"]
