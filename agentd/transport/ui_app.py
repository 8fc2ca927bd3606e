"""``/ui/``: a small live page on the serve listener, for a person watching a daemon in a browser.

The page is a few plain files shipped in the package (``agentd/transport/ui/``): no build step, no CDN, no
framework. In the browser it opens the listener's own ``/events`` WebSocket and draws the run tree from its
``tree.node`` messages (status, steps, tokens, the tools in flight, elapsed time) and a run's recent event
lines. The daemon does nothing for it until a page is open: the files are read from the package at the
first request and kept (a few kilobytes); the feed is ``/events``' own.

The gate is the listener's (agentd.transport.gate, as for ``/events``): Host and Origin (DNS
rebinding), then the listener's authentication: nothing on a listener without it, the TLS client
certificate with mTLS, the ``Authorization`` header (the static bearer or an OAuth token, as a reverse
proxy in front adds it). A browser alone cannot put a header on a page load or a WebSocket, so a listener
with a static bearer (``--serve-bearer``) also has a login: an unauthenticated page request is refused
(401) with a small form as its body; the token typed there is posted to ``/ui/login`` (same origin, Host
and Origin checked, compared in constant time) and answered with a session cookie, ``HttpOnly``,
``SameSite=Strict`` (``Secure`` over TLS), whose value is an HMAC of the bearer (never the bearer itself;
it stops working when the bearer changes). The cookie stands for the bearer on ``/ui/`` and ``/events``
only (:func:`with_session`), never on the MCP endpoint.

Every reply carries a strict Content-Security-Policy (this origin's files and WebSocket only, no inline
code, no framing), ``nosniff`` and ``no-referrer``; the page inserts every string the daemon sends (model
and server text included) as text, never as markup. docs/observability.md, "Watching a daemon in a
browser", is the user's side of this.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio

from agentd.mcp.server_session import HttpReply
from agentd.transport.asgi import Receive, Scope, Send, request_headers, send_reply
from agentd.transport.gate import Gate

UI_PATH: Final = "/ui"
UI_PREFIX: Final = "/ui/"
LOGIN_PATH: Final = "/ui/login"
#: The page's files (under ``agentd/transport/ui/``) by the name they are served under, with their types.
FILES: Final = {
    "index.html": "text/html; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
INDEX: Final = "index.html"
#: The login form's parts, inlined into the 401 body (its script allowed by hash); not served on their own.
LOGIN_FILES: Final = ("login.html", "login.js")
#: Self only: scripts, styles, images, and the connection to ``/events`` (CSP 3: ``'self'`` covers this
#: origin's ``ws:``/``wss:``). Nothing inline, nothing framed, no form or ``<base>``.
CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
              "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS: Final = (
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cross-origin-resource-policy", "same-origin"),
    ("cache-control", "no-cache"),
)
#: The session cookie's name (the port is added: cookies do not tell one port of a host from another).
COOKIE: Final = "agentd_ui"
#: What the cookie's value is an HMAC of, keyed with the bearer.
SESSION_LABEL: Final = b"agentd /ui/ session"
#: A posted login: at most this many bytes, within this many seconds.
LOGIN_MAX: Final = 4096
LOGIN_TIMEOUT: Final = 10.0

#: The listener's checks: Host/Origin then the static bearer (None: passed), and the awaited rest (OAuth).
Trust = Callable[[Mapping[str, str]], HttpReply | None]
Authorize = Callable[[Mapping[str, str]], Awaitable[HttpReply | None]]

_loaded: dict[str, bytes] = {}


class UiApp:
    """The mounted app of :data:`UI_PATH` and every path under :data:`UI_PREFIX`."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate = self.gate
        await send_reply(send, await ui_answer(scope, request_headers(scope), receive, trust=gate.trust,
                                               authorize=gate.authorize, bearer=gate.bearer))


async def ui_answer(scope: Mapping[str, Any], headers: Mapping[str, str], receive: Receive, *, trust: Trust,
                    authorize: Authorize, bearer: str | None) -> HttpReply:
    """The answer to a request for a ``/ui/`` path: the listener's gate (``trust``, ``authorize``; a valid
    session cookie counts as ``bearer``), then a file, the login, or a refusal."""
    method, path = scope["method"], scope["path"]
    if path == LOGIN_PATH and bearer is not None:
        return await _login(scope, headers, receive, trust, bearer)
    headers = with_session(headers, bearer)
    refusal = trust(headers) or await authorize(headers)
    if refusal is not None:
        if refusal.status == 401 and method in ("GET", "HEAD") and path == UI_PATH:
            return ui_reply(method, path)  # to /ui/ (the page's relative links need the slash), refused there
        if refusal.status == 401 and bearer is not None and method == "GET" and _page(path):
            return _login_form(refusal)
        return refusal
    return ui_reply(method, path)


def ui_reply(method: str, path: str) -> HttpReply:
    """The answer to an authenticated request for ``path``."""
    if method not in ("GET", "HEAD"):
        return _reply(405, b"method not allowed\n", "text/plain; charset=utf-8", ("allow", "GET, HEAD"))
    if path == UI_PATH:
        return _reply(308, b"", "text/plain; charset=utf-8", ("location", UI_PREFIX))
    name = path[len(UI_PREFIX):] or INDEX
    content_type = FILES.get(name)
    if content_type is None:
        return _reply(404, b"not found\n", "text/plain; charset=utf-8")
    return _reply(200, _file(name), content_type)


def with_session(headers: Mapping[str, str], bearer: str | None) -> Mapping[str, str]:
    """``headers`` with a valid session cookie in the place of the bearer it stands for (for ``/ui/`` and
    ``/events`` only); unchanged without one, or when an ``Authorization`` header is there already."""
    if bearer is None or "authorization" in headers or "cookie" not in headers:
        return headers
    value = _cookie(headers["cookie"], _cookie_name(headers))
    if value is None or not hmac.compare_digest(value.encode(), session_value(bearer).encode()):
        return headers
    return {**headers, "authorization": f"Bearer {bearer}"}


def session_value(bearer: str) -> str:
    return hmac.new(bearer.encode(), SESSION_LABEL, hashlib.sha256).hexdigest()


async def _login(scope: Mapping[str, Any], headers: Mapping[str, str], receive: Receive, trust: Trust,
                 bearer: str) -> HttpReply:
    """``POST /ui/login`` with the token as the body: Host and Origin as for every request, then the token;
    a session cookie when it is the bearer."""
    if scope["method"] != "POST":
        return _reply(405, b"method not allowed\n", "text/plain; charset=utf-8", ("allow", "POST"))
    body = await _small_body(receive)
    candidate = (body or b"").decode("utf-8", "replace").strip()
    refusal = trust({**headers, "authorization": f"Bearer {candidate}"})
    if refusal is not None and refusal.status != 401:
        return refusal  # Host or Origin: this page's own origin posts here, nobody else
    if body is None or refusal is not None or not hmac.compare_digest(candidate.encode(), bearer.encode()):
        return _reply(401, b"wrong token\n", "text/plain; charset=utf-8")
    cookie = f"{_cookie_name(headers)}={session_value(bearer)}; Path=/; HttpOnly; SameSite=Strict"
    if scope.get("scheme") == "https":
        cookie += "; Secure"
    return _reply(204, b"", None, ("set-cookie", cookie))


async def _small_body(receive: Receive) -> bytes | None:
    """The request body, or None when it is larger than :data:`LOGIN_MAX` or slower than its time."""
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(LOGIN_TIMEOUT):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > LOGIN_MAX:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
    return None


def _login_form(refusal: HttpReply) -> HttpReply:
    """The refusal of a page request, with the login form as its body (its one script allowed by hash)."""
    script = _file("login.js")
    digest = base64.b64encode(hashlib.sha256(script).digest()).decode()
    body = _file("login.html").replace(b"<!--script-->", b"<script>" + script + b"</script>")
    policy = CSP.replace("script-src 'self'", f"script-src 'sha256-{digest}'").replace("img-src 'self'",
                                                                                       "img-src data:")
    return HttpReply(refusal.status, body, "text/html; charset=utf-8",
                     headers=(*refusal.headers, ("content-security-policy", policy), *HEADERS))


def _page(path: str) -> bool:
    return path in (UI_PREFIX, UI_PREFIX + INDEX)


def _cookie_name(headers: Mapping[str, str]) -> str:
    host = headers.get("host", "")
    port = host.rpartition(":")[2] if host.rpartition(":")[2].isdigit() else ""
    return f"{COOKIE}_{port}" if port else COOKIE


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value
    return None


def _reply(status: int, body: bytes, content_type: str | None, *extra: tuple[str, str]) -> HttpReply:
    return HttpReply(status, body, content_type, headers=(*extra, ("content-security-policy", CSP), *HEADERS))


def _file(name: str) -> bytes:
    """One of :data:`FILES` or :data:`LOGIN_FILES`, read from the package once."""
    body = _loaded.get(name)
    if body is None:
        from importlib import resources  # at the first page load, not at the listener's start

        body = _loaded[name] = resources.files("agentd.transport").joinpath("ui", name).read_bytes()
    return body


__all__ = ["CSP", "FILES", "UI_PREFIX", "UiApp", "session_value", "ui_answer", "ui_reply", "with_session"]
