"""What the accept loop and a connection's protocol runner share: one admitted connection's state, and its ASGI scope.

The accept loop (:mod:`agentd.transport.connections`) decides *whether* a connection runs and which idle one
makes room for it; the runners (:mod:`agentd.transport.http11`, :mod:`agentd.transport.http2`) decide *when* it
is idle. Both meet here, on a :class:`Served` record: a runner reads its socket inside :attr:`Served.reads`, a
cancel scope whose deadline is the idle limit while the connection is idle and infinity while a request is in
flight, so the idle limit, eviction at the total cap and closing at shutdown are one deadline moved by both
sides (no timer task, no checkpoint per request).
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from math import inf
from typing import Any, Final
from urllib.parse import unquote

import attrs
import trio

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: How many bytes one socket read asks for.
READ_SIZE: Final = 65536
#: The ASGI version every scope names.
ASGI: Final = {"version": "3.0", "spec_version": "2.3"}

REASONS: Final = {status.value: status.phrase.encode("ascii") for status in HTTPStatus}


@attrs.frozen
class Settings:
    """How connections are served (from ``ServeConfig``; the defaults live there)."""

    #: A connection must finish its request head within this, and an idle connection closes after it.
    idle_timeout: float
    http2: bool = False
    #: Paths whose ``GET`` with ``Upgrade: websocket`` becomes a WebSocket; elsewhere an upgrade stays plain HTTP.
    websocket_paths: frozenset[str] = frozenset()
    #: A request head (request line and headers) larger than this is refused with 431.
    max_head: int = 16 * 1024
    #: Concurrent HTTP/2 streams per connection (advertised in SETTINGS_MAX_CONCURRENT_STREAMS).
    h2_max_streams: int = 32
    #: An HTTP/2 header list (decoded) larger than this is refused (advertised in SETTINGS_MAX_HEADER_LIST_SIZE).
    h2_max_header_list: int = 64 * 1024
    #: HTTP/2 control frames (each kind counted on its own) a connection may send per second.
    h2_max_control_per_second: int = 100


class Runner:
    """What the accept loop hands a protocol runner (agentd.transport.http11, agentd.transport.http2): the
    connection's stream, the app, its own record, and what the app's scope says of it. Each runner sets up its
    protocol state in :meth:`setup`."""

    def __init__(self, stream: trio.abc.Stream, app: App, served: Served, *, scheme: str,
                 client: tuple[str, int] | None, server: tuple[str, int] | None,
                 on_app_error: Callable[[BaseException], None]) -> None:
        self.stream = stream
        self.app = app
        self.served = served
        self.scheme = scheme
        self.client = client
        self.server = server
        self.on_app_error = on_app_error
        self.setup()

    def setup(self) -> None:
        """The protocol's own state (a subclass's)."""


@attrs.define(eq=False)
class Served:
    """One admitted connection, as the accept loop sees it."""

    settings: Settings
    #: When the connection last became idle (admitted, or its last request answered).
    idle_since: float
    #: Nothing in flight: before its first request head is complete, or between requests.
    idle: bool = True
    #: Closed to make room for a new connection (it no longer counts against the total cap).
    evicted: bool = False
    #: Shutdown: close when idle, and after the response in flight.
    closing: bool = False
    #: The scope the runner reads in; its deadline is the idle limit (see the module docstring).
    reads: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    def __attrs_post_init__(self) -> None:
        self.reads.deadline = self.idle_since + self.settings.idle_timeout

    def enter(self) -> trio.CancelScope:
        """A fresh :attr:`reads` scope with the deadline so far, for the next phase (TLS handshake, then HTTP)."""
        self.reads = trio.CancelScope(deadline=self.reads.deadline)
        return self.reads

    def busy(self) -> None:
        """A request came in: no idle limit until it is answered (and not evicted, even if just chosen)."""
        self.idle = False
        self.evicted = False
        self.reads.deadline = inf

    def rest(self) -> None:
        """The last request is answered: idle again, closing at the idle limit (at once when shutting down)."""
        self.idle = True
        self.idle_since = now = trio.current_time()
        self.reads.deadline = now if self.closing else now + self.settings.idle_timeout

    def evict(self) -> None:
        """Close this idle connection now (a request that came in meanwhile keeps it: :meth:`busy` wins)."""
        self.evicted = True
        self.reads.deadline = trio.current_time()

    def close_when_idle(self) -> None:
        self.closing = True
        if self.idle:
            self.reads.deadline = trio.current_time()


def http_scope(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], http_version: str, scheme: str,
               client: tuple[str, int] | None, server: tuple[str, int] | None) -> Scope:
    raw_path, _, query = target.partition(b"?")
    return {
        "type": "http", "asgi": ASGI, "http_version": http_version, "method": method.decode("ascii").upper(),
        "scheme": scheme, "path": unquote(raw_path.decode("latin-1")), "raw_path": raw_path, "query_string": query,
        "root_path": "", "headers": headers, "client": client, "server": server, "extensions": {},
    }


def address(sock: Any, peer: bool) -> tuple[str, int] | None:
    """A socket's (host, port), or None for a socket without one (a UNIX socket, or one already reset)."""
    try:
        name = sock.getpeername() if peer else sock.getsockname()
    except OSError:
        return None
    return (str(name[0]), int(name[1])) if isinstance(name, tuple) else None


class HttpDate:
    """The ``Date`` header's value, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, email.utils.formatdate(now, usegmt=True).encode("ascii")
        return self._value


http_date: Final = HttpDate()
