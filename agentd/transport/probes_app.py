"""``/healthz`` and ``/readyz``: liveness and readiness, on the serve listener and on ``--metrics-addr``.

No authentication and no information beyond ok or not ok (:mod:`agentd.telemetry.health` decides which).
``GET`` and ``HEAD`` only; any other method is the listener's 404, as on a path nothing is mounted on.
"""

from __future__ import annotations

from agentd.mcp.server_session import HttpReply
from agentd.telemetry.health import PROBES, probe
from agentd.transport.asgi import Receive, Scope, Send, not_found, send_reply

#: The paths this app is mounted on.
PATHS = PROBES


async def probes(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["method"] not in ("GET", "HEAD"):
        await not_found(scope, receive, send)
        return
    status, text = probe(scope["path"])
    await send_reply(send, HttpReply(status, text, "text/plain"))


__all__ = ["PATHS", "probes"]
