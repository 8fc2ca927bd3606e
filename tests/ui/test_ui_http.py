"""``/ui/`` over plain HTTP: the listener's gate (Host, Origin, the bearer: as for ``/events``), then the
page's files with their content types and a strict Content-Security-Policy; anything else under ``/ui/`` is
404, other methods 405. A real daemon (in this process) serves them on a real socket."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from agentd.config.load import load_config
from agentd.daemon import main
from agentd.oversight.drain import DrainLatch, use_drain
from agentd.telemetry.events import EventLog
from agentd.transport.ui_app import CSP, session_value
from tests.waiting import until

TOKEN = "ui-serve-token-1234"


async def _serving(nursery: trio.Nursery, argv: list[str], env: dict[str, str]) -> tuple[str, DrainLatch,
                                                                                         list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    cfg = load_config(argv, env=env)
    latch = DrainLatch()

    async def daemon() -> None:
        with use_drain(latch):
            await main(cfg, log=EventLog(sink=events.append, level=cfg.telemetry.log_level), env=env)

    nursery.start_soon(daemon)
    await until(lambda: any(e["event"] == "serve.start" for e in events), timeout=20, what="serve.start")
    url = next(e for e in events if e["event"] == "serve.start")["urls"][0]
    return url.split("/mcp")[0].rstrip("/"), latch, events


async def test_the_page_needs_what_events_needs_and_is_served_with_its_types():
    env = {"SERVE_TOKEN": TOKEN}
    async with trio.open_nursery() as nursery:
        base, latch, events = await _serving(nursery, ["--intelligence", "test", "--serve-mcp",
                                                       "http://127.0.0.1:0/mcp",
                                                       "--serve-bearer", "{{secret:SERVE_TOKEN}}"], env)
        good = {"authorization": f"Bearer {TOKEN}"}
        port = base.rsplit(":", 1)[1]
        async with httpx.AsyncClient() as client:
            # the bearer, as on /mcp and /events: none or a wrong one is 401 with the Bearer challenge
            for headers in ({}, {"authorization": "Bearer wrong-token-99"}, {"authorization": TOKEN},
                            {"cookie": f"agentd_ui_{port}=wrong; agentd_ui={session_value(TOKEN)}"}):
                for path in ("/ui/", "/ui/index.html", "/ui/ui.js", "/ui/ui.css", "/ui/nope", "/ui/login.js"):
                    if path == "/ui/nope":  # /ui itself only says where the page is (refused there)
                        r = await client.get(base + "/ui", headers=headers)
                        assert r.status_code == 308 and r.headers["location"] == "/ui/"
                    r = await client.get(base + path, headers=headers)
                    assert r.status_code == 401, (path, headers, r.status_code)
                    assert r.headers["www-authenticate"].startswith("Bearer")
                    assert "WebSocket" not in r.text and "ui.js" not in r.text
                    if path in ("/ui/", "/ui/index.html"):  # a person's browser: the login form as the body
                        assert 'id="login"' in r.text and r.headers["content-type"].startswith("text/html")
                        assert "script-src 'sha256-" in r.headers["content-security-policy"]
                    else:
                        assert "<html" not in r.text
            # Host and Origin (DNS rebinding), before the token is looked at: 403
            r = await client.get(base + "/ui/", headers={**good, "host": "evil.example"})
            assert r.status_code == 403 and "Host" in r.text
            r = await client.get(base + "/ui/", headers={**good, "origin": "http://evil.example"})
            assert r.status_code == 403 and "Origin" in r.text
            r = await client.get(base + "/ui/", headers={**good, "origin": base})
            assert r.status_code == 200
            # the files, each with its type, all with the policy and nosniff
            for path, kind in (("/ui/", "text/html"), ("/ui/index.html", "text/html"),
                               ("/ui/ui.js", "text/javascript"), ("/ui/ui.css", "text/css"),
                               ("/ui/favicon.svg", "image/svg+xml")):
                r = await client.get(base + path, headers=good)
                assert r.status_code == 200, path
                assert r.headers["content-type"].split(";")[0] == kind, path
                assert r.headers["content-security-policy"] == CSP
                assert r.headers["x-content-type-options"] == "nosniff"
                assert r.headers["x-frame-options"] == "DENY"
                assert int(r.headers["content-length"]) == len(r.content) > 0
            page = (await client.get(base + "/ui/", headers=good)).text
            assert '<script src="ui.js"' in page and "<script>" not in page and "style=" not in page
            head = await client.head(base + "/ui/ui.js", headers=good)
            assert head.status_code == 200 and head.content == b""
            assert head.headers["content-type"].startswith("text/javascript")
            # unknown paths under /ui/ (a traversal included), /ui itself, other methods
            for path in ("/ui/nope", "/ui/ui.js/x", "/ui/%2e%2e/ui_app.py", "/ui/%2e%2e/%2e%2e/pyproject.toml",
                         "/ui/ui", "/ui/UI.JS"):
                r = await client.get(base + path, headers=good)
                assert r.status_code == 404, path
                assert r.headers["content-security-policy"] == CSP
            r = await client.get(base + "/ui", headers=good)
            assert r.status_code == 308 and r.headers["location"] == "/ui/"
            r = await client.post(base + "/ui/", headers=good, content=b"x")
            assert r.status_code == 405 and "GET" in r.headers["allow"]
            # the rest of the listener is unchanged: /uix is not the page
            assert (await client.get(base + "/uix", headers=good)).status_code == 404
            assert (await client.get(base + "/healthz")).status_code == 200
        latch.request("test")
    refusals = [e for e in events if e["event"] == "serve.refused"]
    assert {e["reason"] for e in refusals} >= {"bearer", "host", "origin"}
    assert TOKEN not in repr(events)


def test_every_page_file_is_served_and_ships_in_the_wheel():
    """The files under agentd/transport/ui are exactly the served ones, and pyproject's package data (what a
    pip install copies) matches each of them."""
    import fnmatch
    import tomllib
    from pathlib import Path

    from agentd.transport.ui_app import FILES, LOGIN_FILES

    root = Path(__file__).resolve().parents[2]
    folder = root / "agentd" / "transport" / "ui"
    on_disk = {p.name for p in folder.iterdir() if p.is_file()}
    assert on_disk == set(FILES) | set(LOGIN_FILES)
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["agentd"]
    for name in on_disk:
        assert any(fnmatch.fnmatch(f"transport/ui/{name}", g) for g in globs), name


async def test_a_bearer_listener_logs_a_browser_in_with_a_cookie_for_the_page_and_events_only():
    env = {"SERVE_TOKEN": TOKEN}
    async with trio.open_nursery() as nursery:
        base, latch, events = await _serving(nursery, ["--intelligence", "test", "--serve-mcp",
                                                       "http://127.0.0.1:0/mcp",
                                                       "--serve-bearer", "{{secret:SERVE_TOKEN}}"], env)
        port = int(base.rsplit(":", 1)[1])
        login = base + "/ui/login"
        async with httpx.AsyncClient() as client:
            assert (await client.get(login)).status_code == 405
            for body in (b"", b"wrong-token-99", TOKEN.encode() + b"x", b"x" * 5000):
                r = await client.post(login, content=body)
                assert r.status_code == 401 and "set-cookie" not in r.headers, body[:20]
            r = await client.post(login, content=TOKEN.encode(), headers={"origin": "http://evil.example"})
            assert r.status_code == 403 and "set-cookie" not in r.headers
            r = await client.post(login, content=TOKEN.encode(), headers={"host": "evil.example"})
            assert r.status_code == 403 and "set-cookie" not in r.headers
            r = await client.post(login, content=TOKEN.encode(), headers={"origin": base})
            assert r.status_code == 204
            cookie = r.headers["set-cookie"]
            name, _, value = cookie.split(";")[0].partition("=")
            assert name == f"agentd_ui_{port}" and value == session_value(TOKEN) and TOKEN not in cookie
            assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {p.strip() for p in cookie.split(";")}
            assert "Secure" not in cookie  # plain HTTP here; over TLS it is Secure
            jar = {"cookie": f"{name}={value}"}
            r = await client.get(base + "/ui/", headers=jar)
            assert r.status_code == 200 and 'src="ui.js"' in r.text
            assert (await client.get(base + "/ui/ui.js", headers=jar)).status_code == 200
            # the cookie is not the bearer anywhere else: the MCP endpoint still wants the header
            r = await client.post(base + "/mcp", headers={**jar, "accept": "application/json, text/event-stream"},
                                  json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert r.status_code == 401
            # another host name or a foreign origin with the cookie: refused as without it
            assert (await client.get(base + "/ui/", headers={**jar, "origin": "http://evil.example"})).status_code \
                == 403
        # /events takes the cookie as it takes the header; a wrong one is refused before the handshake
        assert (await _upgrade(port, f"Cookie: {name}={value}\r\n".encode())).startswith(b"HTTP/1.1 101")
        assert (await _upgrade(port, f"Cookie: {name}=00{value[2:]}\r\n".encode())).startswith(b"HTTP/1.1 403")
        assert (await _upgrade(port, f"Cookie: {name}={value}\r\nOrigin: http://evil.example\r\n".encode())
                ).startswith(b"HTTP/1.1 403")
        latch.request("test")
    assert TOKEN not in repr(events) and session_value(TOKEN) not in repr(events)


async def _upgrade(port: int, extra: bytes) -> bytes:
    """The first bytes of the answer to a raw WebSocket upgrade request for /events."""
    sock = await trio.open_tcp_stream("127.0.0.1", port)
    async with sock:
        await sock.send_all(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
                            + b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
                            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" + extra
                            + b"\r\n")
        with trio.fail_after(10):
            return await sock.receive_some(65536)
