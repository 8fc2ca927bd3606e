"""A listener's served surface as a table: path -> ASGI app, each app in its own module.

A :class:`Mount` names a path and the app that answers it; ``under`` claims every path below it too (``/ui/…``),
``slashes`` the path with trailing slashes (``/mcp/``). The first mount that claims a path wins; a path no mount
claims is 404 (a WebSocket there is refused before its handshake). ``http`` and ``websocket`` scopes have
separate tables: the HTTP server upgrades only its configured WebSocket paths, and an upgrade elsewhere is
answered as plain HTTP by the ``http`` table.

The routing is one dict lookup for a path a mount names exactly (the MCP endpoint's POSTs: the hot path pays
nothing else); only a path that misses it is matched against the mounts in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs

from agentd.transport.asgi import App, Receive, Scope, Send, not_found

#: A WebSocket on a path nothing is mounted on: refused before the handshake (the server answers 403).
REFUSED: Final = {"type": "websocket.close", "code": 1008}


@attrs.frozen
class Mount:
    path: str
    app: App = attrs.field(eq=False)
    #: Every path under ``path + "/"`` too.
    under: bool = False
    #: ``path`` followed by any number of ``/`` too.
    slashes: bool = False

    def claims(self, path: str) -> bool:
        return (path == self.path or (self.under and path.startswith(self.path.rstrip("/") + "/"))
                or (self.slashes and path.endswith("/") and path.rstrip("/") == self.path))


async def refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    await send(dict(REFUSED))


class Mounts:
    """The ASGI app of a table of mounts (``lifespan`` answered, its shutdown :meth:`drain`\\ s)."""

    def __init__(self, http: Iterable[Mount] = (), websocket: Iterable[Mount] = (), *,
                 fallback: App = not_found) -> None:
        self.http: tuple[Mount, ...] = tuple(http)
        self.websocket: tuple[Mount, ...] = tuple(websocket)
        self.fallback = fallback
        self._exact: dict[str, App] = {}
        self._sockets: dict[str, App] = {}
        self._index()

    def mount(self, *mounts: Mount) -> None:
        """Put ``mounts`` before the table's own (they win where both claim a path)."""
        self.http = (*mounts, *self.http)
        self._index()

    def _index(self) -> None:
        self._exact = {m.path: self.find(m.path) for m in self.http}
        self._sockets = {m.path: m.app for m in reversed(self.websocket)}

    def find(self, path: str) -> App:
        """The app of an ``http`` request for ``path``: the first mount that claims it, else the fallback (404)."""
        for mount in self.http:
            if mount.claims(path):
                return mount.app
        return self.fallback

    def drain(self) -> None:
        """End open streams (the apps' own business: a subclass's)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            app = self._exact.get(path)
            await (app if app is not None else self.find(path))(scope, receive, send)
        elif kind == "websocket":
            await self._sockets.get(scope["path"], refuse_websocket)(scope, receive, send)
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    self.drain()
                    await send({"type": "lifespan.shutdown.complete"})
                    return


__all__ = ["Mount", "Mounts", "refuse_websocket"]
