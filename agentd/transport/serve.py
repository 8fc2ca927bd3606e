"""Serve an ASGI app inside agentd's nursery: bind, TLS, mTLS, certificate rotation, graceful shutdown.

``serve_mcp`` binds, reports the bound URLs through ``task_status``, and returns once
``shutdown_trigger`` fires and every connection has finished (open streams are told first through
``app.drain()``; connections still busy after ``graceful_timeout`` are cut). The HTTP server is agentd's own:
the accept loop and per-connection guard (:mod:`agentd.transport.connections`), HTTP/1.1 on h11, WebSocket on
wsproto, HTTP/2 on h2 (see docs/design/served-edge.md for why not hypercorn). trio's ``SSLListener`` gets a
context *proxy* whose ``wrap_bio`` (the one call it makes per connection) uses the newest
:class:`ssl.SSLContext`, so rotated certificate, key and client-CA files take effect for new connections
without a restart. (Switching contexts in an SNI callback would not do: OpenSSL keeps the first context's
verify settings, so a rotated client CA would be ignored.)
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import attrs
import trio

from agentd import defaults
from agentd.errors import ConfigError
from agentd.security.loopback import is_loopback_host
from agentd.telemetry.events import EventLog, null_log
from agentd.transport.connections import ConnectionLimits, Connections
from agentd.transport.resource_server import OAuthSettings
from agentd.transport.served import Settings

#: Pending connections the kernel queues before ``accept``.
LISTEN_BACKLOG = 100


class DrainableApp(Protocol):
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None: ...

    def drain(self) -> None: ...


@attrs.frozen
class ServeConfig:
    """``--serve-mcp`` and its companions. Durations in seconds."""

    url: str
    cert: Path | None = None
    key: Path | None = None
    client_ca: Path | None = None
    bearer: str | None = attrs.field(default=None, repr=False)
    #: A connection must finish its request headers (and idle keep-alive connections close) within this.
    header_timeout: float = 10.0
    #: Grace for in-flight requests at shutdown.
    graceful_timeout: float = 3.0
    #: How often certificate files are checked for rotation.
    reload_interval: float = 2.0
    #: Open connections, in total and per client address; past either, new connections are closed at once.
    max_connections: int = defaults.SERVE_MAX_CONNECTIONS
    max_per_client: int = defaults.SERVE_MAX_PER_CLIENT
    #: Serve HTTP/2 (ALPN ``h2`` over TLS, ``h2c`` in clear); off: HTTP/1.1 only.
    http2: bool = False
    #: OAuth access tokens (``--serve-oauth-*``): counts as authentication for a non-loopback listener.
    oauth: OAuthSettings | None = None
    #: Paths served as WebSockets (the self-MCP's ``/events``); empty: no WebSocket at all.
    websocket_paths: frozenset[str] = frozenset()

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port if parts.port is not None else (443 if parts.scheme == "https" else 80)

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "https"

    @property
    def paths(self) -> frozenset[str]:
        path = urlsplit(self.url).path.rstrip("/") or "/"
        return frozenset({path, "/mcp"})

    @property
    def loopback(self) -> bool:
        return is_loopback_host(self.host)


def check_serve_config(cfg: ServeConfig) -> None:
    """Raise :class:`ConfigError` (exit 2) before anything binds."""
    parts = urlsplit(cfg.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("--serve-mcp must be http(s)://host:port[/path]")
    try:
        _ = parts.port
    except ValueError:
        raise ConfigError("--serve-mcp has an invalid port") from None
    if cfg.tls and (cfg.cert is None or cfg.key is None):
        raise ConfigError("--serve-mcp https:// needs --serve-cert and --serve-key")
    if not cfg.tls and (cfg.cert is not None or cfg.client_ca is not None):
        raise ConfigError("--serve-cert/--serve-client-ca need an https:// --serve-mcp URL")
    if not cfg.loopback and cfg.client_ca is None and not cfg.bearer and cfg.oauth is None:
        raise ConfigError(
            "refusing to serve on a non-loopback address without authentication: "
            "set --serve-client-ca (mTLS), --serve-bearer or --serve-oauth-issuer"
        )
    for flag, path in (("--serve-cert", cfg.cert), ("--serve-key", cfg.key), ("--serve-client-ca", cfg.client_ca)):
        if path is not None and not path.is_file():
            raise ConfigError(f"{flag}: no such file: {path}")


def _fingerprint(paths: list[Path]) -> tuple[tuple[int, int, int], ...]:
    out = []
    for path in paths:
        st = os.stat(path)
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


@attrs.define(eq=False)
class ReloadingTls:
    """Builds server contexts from files and hands the newest to every new handshake."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    log: EventLog = attrs.field(factory=null_log)
    http2: bool = False
    current: ssl.SSLContext = attrs.field(init=False)
    _seen: tuple[tuple[int, int, int], ...] = attrs.field(init=False, default=())

    def __attrs_post_init__(self) -> None:
        try:
            self._seen = _fingerprint(self._files())
            self.current = self.build()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the serving certificate or key: {exc.__class__.__name__}") from None

    @property
    def front(self) -> ssl.SSLContext:
        """What trio's SSLListener holds: every new connection wraps with ``current``."""
        return cast(ssl.SSLContext, _ContextProxy(self))

    def _files(self) -> list[Path]:
        return [self.cert, self.key] + ([self.client_ca] if self.client_ca is not None else [])

    def build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_COMPRESSION
        context.set_alpn_protocols(["h2", "http/1.1"] if self.http2 else ["http/1.1"])
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            context.load_verify_locations(cafile=self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def check(self) -> bool:
        """Reload when any file changed; a broken new set keeps the old context (and is logged)."""
        try:
            seen = _fingerprint(self._files())
        except OSError:
            return False
        if seen == self._seen:
            return False
        try:
            fresh = self.build()
        except (OSError, ssl.SSLError) as exc:
            self.log.warn("serve.cert_reload", ok=False, error=exc.__class__.__name__)
            return False
        self._seen = seen
        self.current = fresh
        self.log.info("serve.cert_reload", ok=True)
        return True

    async def watch(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            self.check()


class _ContextProxy:
    """Duck-types the part of :class:`ssl.SSLContext` trio's ``SSLListener`` uses, always the newest."""

    def __init__(self, source: ReloadingTls) -> None:
        self._source = source

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        return self._source.current.wrap_bio(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source.current, name)


@attrs.frozen
class Serving:
    """What ``task_status.started`` reports."""

    urls: tuple[str, ...]
    port: int


def settings(cfg: ServeConfig) -> Settings:
    return Settings(idle_timeout=cfg.header_timeout, http2=cfg.http2, websocket_paths=cfg.websocket_paths)


async def _listener(cfg: ServeConfig, context: ssl.SSLContext | None) -> tuple[trio.abc.Listener[Any], str]:
    host = cfg.host.strip("[]")
    sock = trio.socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind((host, cfg.port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    bound_host, port = sock.getsockname()[:2]
    where = f"[{bound_host}]:{port}" if ":" in bound_host else f"{bound_host}:{port}"
    listener: trio.abc.Listener[Any] = trio.SocketListener(sock)
    if context is None:
        return listener, f"http://{where}"
    return trio.SSLListener(listener, context, https_compatible=True), f"https://{where}"


async def serve_mcp(
    app: DrainableApp,
    cfg: ServeConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[object]],
    log: EventLog | None = None,
    on_bound: Callable[[Serving], None] | None = None,
    task_status: trio.TaskStatus[Serving] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown_trigger`` returns; open streams get ``app.drain()`` first. ``on_bound`` learns
    the bound URLs before the first connection is accepted (an OAuth audience of ``--serve-mcp ...:0``)."""
    log = log or null_log()
    check_serve_config(cfg)
    tls = (ReloadingTls(cfg.cert, cfg.key, cfg.client_ca, log, http2=cfg.http2)
           if cfg.tls and cfg.cert and cfg.key else None)
    limits = ConnectionLimits(max_connections=cfg.max_connections, max_per_client=cfg.max_per_client)
    connections = Connections(app, settings(cfg), limits, log)
    listener, bind = await _listener(cfg, tls.front if tls is not None else None)
    listeners, binds = [listener], [bind]
    serving = Serving(tuple(binds), int(bind.rsplit(":", 1)[1]))
    if on_bound is not None:
        on_bound(serving)
    async with trio.open_nursery() as nursery:
        if tls is not None:
            nursery.start_soon(tls.watch, cfg.reload_interval)
        async with trio.open_nursery() as handlers:
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(connections.accept_loop, listener, handlers)
                # advertised with the served path (the configured one, else /mcp): a bare origin may answer 404
                path = urlsplit(cfg.url).path.rstrip("/") or "/mcp"
                log.info("serve.start", urls=[bind + path for bind in binds], tls=tls is not None,
                         mtls=cfg.client_ca is not None, bearer=cfg.bearer is not None, oauth=cfg.oauth is not None,
                         http2=cfg.http2)
                task_status.started(serving)
                await shutdown_trigger()
                accepting.cancel_scope.cancel()  # listeners close: no new connections
            # Streams end themselves once told (final frames written); idle connections close as soon as
            # ``terminated`` is set, busy ones after their current response. Whatever is left at the grace
            # deadline is cut.
            app.drain()
            connections.drain()
            handlers.cancel_scope.deadline = trio.current_time() + cfg.graceful_timeout
        nursery.cancel_scope.cancel()  # served and drained: stop the certificate watcher too
    log.info("serve.stop")
