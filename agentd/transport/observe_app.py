"""``--metrics-addr``: Prometheus exposition at ``GET /metrics`` (plus the ``/healthz`` and ``/readyz``
probes), served by the same HTTP server, connection guard and TLS as the self-MCP server.

A loopback listener needs no authentication. A non-loopback one follows the self-MCP's rules (config
validation refuses it otherwise): ``--serve-bearer`` is required on ``/metrics`` when set, and with
``--serve-client-ca`` the listener is TLS (``--serve-cert``/``--serve-key``) and requires client
certificates. The probes answer without authentication and say nothing but ok or not.
"""

from __future__ import annotations

import hmac
from typing import Any

import trio

from agentd.events import EventLog
from agentd.telemetry import health, metrics
from agentd.transport.serve import ServeConfig, Serving, serve_mcp


class ObserveApp:
    def __init__(self, bearer: str | None) -> None:
        self._bearer = bearer

    def drain(self) -> None:
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        if scope["method"] not in ("GET", "HEAD"):
            await _reply(send, 405, b"method not allowed\n", "text/plain")
        elif path in health.PROBES:
            status, body = health.probe(path)
            await _reply(send, status, body, "text/plain")
        elif path != "/metrics":
            await _reply(send, 404, b"not found\n", "text/plain")
        elif not self._authorized(scope):
            await _reply(send, 401, b"unauthorized\n", "text/plain", [(b"www-authenticate", b"Bearer")])
        else:
            registry = metrics.current()
            body, content_type = registry.exposition() if registry is not None else (b"", "text/plain")
            await _reply(send, 200, body, content_type)

    def _authorized(self, scope: Any) -> bool:
        if self._bearer is None:
            return True
        given = b""
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                given = value
        scheme, _, token = given.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._bearer.encode())


async def _reply(send: Any, status: int, body: bytes, content_type: str,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
               *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def serve_metrics(cfg: ServeConfig, log: EventLog,
                        task_status: trio.TaskStatus[Serving] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``/metrics`` until cancelled (the daemon nursery ends it)."""
    metrics.enable()
    await serve_mcp(ObserveApp(cfg.bearer), cfg, shutdown_trigger=trio.sleep_forever,
                    log=log.bind(comp="metrics"), task_status=task_status)
