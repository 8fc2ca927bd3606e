"""``/ui/`` over plain HTTP: the listener's gate (Host, Origin, the bearer: as for ``/events``), then the
page's files with their content types and a strict Content-Security-Policy; anything else under ``/ui/`` is
404, other methods 405. A real daemon (in this process) serves them on a real socket."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from agentd.config import Config
from agentd.daemon import main
from agentd.drain import DrainLatch, use_drain
from agentd.events import EventLog
from agentd.transport.ui_app import CSP

TOKEN = "ui-serve-token-1234"


async def _serving(nursery: trio.Nursery, argv: list[str], env: dict[str, str]) -> tuple[str, DrainLatch,
                                                                                         list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    cfg = Config.from_argv(argv, env=env)
    latch = DrainLatch()

    async def daemon() -> None:
        with use_drain(latch):
            await main(cfg, log=EventLog(sink=events.append, level=cfg.log_level), env=env)

    nursery.start_soon(daemon)
    with trio.fail_after(20):
        while not any(e["event"] == "serve.start" for e in events):
            await trio.sleep(0.02)
    url = next(e for e in events if e["event"] == "serve.start")["urls"][0]
    return url.split("/mcp")[0].rstrip("/"), latch, events


async def test_the_page_needs_what_events_needs_and_is_served_with_its_types():
    env = {"SERVE_TOKEN": TOKEN}
    async with trio.open_nursery() as nursery:
        base, latch, events = await _serving(nursery, ["--intelligence", "test", "--serve-mcp",
                                                       "http://127.0.0.1:0/mcp",
                                                       "--serve-bearer", "{{secret:SERVE_TOKEN}}"], env)
        good = {"authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient() as client:
            # the bearer, as on /mcp and /events: none or a wrong one is 401 with the Bearer challenge
            for headers in ({}, {"authorization": "Bearer wrong-token-99"}, {"authorization": TOKEN}):
                for path in ("/ui/", "/ui/ui.js", "/ui/nope"):
                    r = await client.get(base + path, headers=headers)
                    assert r.status_code == 401, (path, headers, r.status_code)
                    assert r.headers["www-authenticate"].startswith("Bearer")
                    assert "<html" not in r.text and "WebSocket" not in r.text
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
