"""``/ui/``: a small live page on the serve listener, for a person watching a daemon in a browser.

The page is a few plain files shipped in the package (``agentd/transport/ui/``): no build step, no CDN, no
framework. In the browser it opens the listener's own ``/events`` WebSocket and draws the run tree from its
``tree.node`` messages (status, steps, tokens, the tools in flight, elapsed time) and a run's recent event
lines. The daemon does nothing for it until a page is open: the files are read from the package at the
first request and kept (a few kilobytes); the feed is ``/events``' own.

This module only answers what is past the gate: the listener (agentd.transport.asgi_server) checks Host
and Origin and authenticates a ``/ui/`` request exactly as it does ``/events``, then asks
:func:`ui_reply` for the file. The reply is data (:class:`HttpReply`): ``GET``/``HEAD`` of a known file
(with its content type), ``/ui`` redirected to ``/ui/``, 404 for any other path under ``/ui/``, 405 for
other methods. Every reply carries a strict Content-Security-Policy (this origin's files and WebSocket
only: no inline script or style, no other origin, no framing), ``nosniff`` and ``no-referrer``: the page
inserts every string the daemon sends (model and server text included) as text, never as markup, and the
policy would refuse an injected script if it did not. docs/operations.md, "Watching a daemon in a
browser", says how each authentication mode reaches the page.
"""

from __future__ import annotations

from typing import Final

from agentd.mcp.server_session import HttpReply

UI_PATH: Final = "/ui"
UI_PREFIX: Final = "/ui/"
#: The page's files (under ``agentd/transport/ui/``) by the name they are served under, with their types.
FILES: Final = {
    "index.html": "text/html; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
INDEX: Final = "index.html"
#: Self only: scripts, styles, images, and the connection to ``/events`` (CSP 3: ``'self'`` covers this
#: origin's ``ws:``/``wss:``). Nothing inline, nothing framed, no form or ``<base>``.
CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
              "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS: Final = (
    ("content-security-policy", CSP),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cross-origin-resource-policy", "same-origin"),
    ("cache-control", "no-cache"),
)

_loaded: dict[str, bytes] = {}


def is_ui_path(path: str) -> bool:
    """Whether the listener hands ``path`` to this module (after its gate)."""
    return path == UI_PATH or path.startswith(UI_PREFIX)


def ui_reply(method: str, path: str) -> HttpReply:
    """The answer to an authenticated request for ``path`` (one :func:`is_ui_path` accepted)."""
    if method not in ("GET", "HEAD"):
        return HttpReply(405, b"method not allowed\n", "text/plain; charset=utf-8",
                         headers=(("allow", "GET, HEAD"), *HEADERS))
    if path == UI_PATH:
        return HttpReply(308, b"", "text/plain; charset=utf-8", headers=(("location", UI_PREFIX), *HEADERS))
    name = path[len(UI_PREFIX):] or INDEX
    content_type = FILES.get(name)
    if content_type is None:
        return HttpReply(404, b"not found\n", "text/plain; charset=utf-8", headers=HEADERS)
    return HttpReply(200, _file(name), content_type, headers=HEADERS)


def _file(name: str) -> bytes:
    """One of :data:`FILES`, read from the package once."""
    body = _loaded.get(name)
    if body is None:
        from importlib import resources  # at the first page load, not at the listener's start

        body = _loaded[name] = resources.files("agentd.transport").joinpath("ui", name).read_bytes()
    return body


__all__ = ["CSP", "FILES", "UI_PREFIX", "is_ui_path", "ui_reply"]
