"""``--metrics-addr``: Prometheus exposition at ``GET /metrics`` (plus the ``/healthz`` and ``/readyz``
probes), served by the same HTTP server, connection guard and TLS as the self-MCP server.

A loopback listener needs no authentication. A non-loopback one follows the self-MCP's rules (config
validation refuses it otherwise): ``--serve-bearer`` is required on ``/metrics`` when set, and with
``--serve-client-ca`` the listener is TLS (``--serve-cert``/``--serve-key``) and requires client
certificates. The probes answer without authentication and say nothing but ok or not. The port answers
``GET`` and ``HEAD`` only (405 for any other method, on any path).
"""

from __future__ import annotations

import hmac
from typing import Final

import trio

from agentd.mcp.server_session import HttpReply
from agentd.telemetry import health, metrics
from agentd.telemetry.events import EventLog
from agentd.transport.asgi import Receive, Scope, Send, send_reply
from agentd.transport.mounts import Mount, Mounts
from agentd.transport.probes_app import probes
from agentd.transport.serve import ServeConfig, Serving, serve_mcp

METRICS_PATH: Final = "/metrics"
METHOD_NOT_ALLOWED: Final = HttpReply(405, b"method not allowed\n", "text/plain")
NOT_FOUND: Final = HttpReply(404, b"not found\n", "text/plain")
UNAUTHORIZED: Final = HttpReply(401, b"unauthorized\n", "text/plain", headers=(("www-authenticate", "Bearer"),))


class MetricsApp:
    """``/metrics``: the current registry's exposition, behind ``--serve-bearer`` when it is set."""

    def __init__(self, bearer: str | None) -> None:
        self._bearer = bearer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._authorized(scope):
            await send_reply(send, UNAUTHORIZED)
            return
        registry = metrics.current()
        body, content_type = registry.exposition() if registry is not None else (b"", "text/plain")
        await send_reply(send, HttpReply(200, body, content_type))

    def _authorized(self, scope: Scope) -> bool:
        if self._bearer is None:
            return True
        given = b""
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                given = value
        scheme, _, token = given.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._bearer.encode())


class ObserveApp(Mounts):
    """The metrics port's table: the probes and ``/metrics``; 404 elsewhere."""

    def __init__(self, bearer: str | None) -> None:
        super().__init__(http=[*(Mount(path, probes) for path in sorted(health.PROBES)),
                               Mount(METRICS_PATH, MetricsApp(bearer))], fallback=_not_found)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD"):
            await send_reply(send, METHOD_NOT_ALLOWED)
            return
        await super().__call__(scope, receive, send)


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    await send_reply(send, NOT_FOUND)


async def serve_metrics(cfg: ServeConfig, log: EventLog,
                        task_status: trio.TaskStatus[Serving] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``/metrics`` until cancelled (the daemon nursery ends it)."""
    metrics.enable()
    await serve_mcp(ObserveApp(cfg.bearer), cfg, shutdown_trigger=trio.sleep_forever,
                    log=log.bind(comp="metrics"), task_status=task_status)
