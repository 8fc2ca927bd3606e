"""``/events``: the daemon's event lines and ``tree.node`` changes over a WebSocket on the serve port, with the
serve port's authentication, and a hostile upgrade that fails alone."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio
from trio_websocket import open_websocket_url

from agentd.config.load import load_config
from agentd.daemon import main
from agentd.oversight.drain import DrainLatch, use_drain
from agentd.telemetry.events import EventLog
from tests.peers.gateway import scripted_gateway, text
from tests.waiting import until


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


async def test_a_subscriber_sees_the_run_tree_and_the_event_lines():
    async with scripted_gateway([text("done", usage={"prompt_tokens": 3, "completion_tokens": 2})]) as gw, \
            trio.open_nursery() as nursery:
        base, latch, events = await _serving(nursery, ["--instruction", "go", "--intelligence", gw.url,
                                                       "--serve-mcp", "http://127.0.0.1:0/mcp",
                                                       "--log-level", "debug"], {})
        await until(lambda: any(e["event"] == "run.end" for e in events), timeout=20, what="run.end")
        got: list[dict[str, Any]] = []
        async with open_websocket_url(base.replace("http://", "ws://") + "/events") as ws:
            with trio.fail_after(10):
                while not any(m.get("event") == "tree.node" and m.get("status") == "completed" for m in got):
                    got.append(json.loads(await ws.get_message()))
            node = next(m for m in got if m.get("event") == "tree.node")
            assert (node["handle"], node["parent"], node["steps"], node["tokens"]) == ("0", None, 1, 5)
            # a line logged from now on arrives live, in the stderr vocabulary: a new MCP session's
            async with httpx.AsyncClient() as client:
                await client.post(base + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
                    headers={"accept": "application/json, text/event-stream"})
            with trio.fail_after(10):
                while not any(m.get("event") == "serve.session" for m in got):
                    got.append(json.loads(await ws.get_message()))
        latch.request("test")
    line = next(m for m in got if m.get("event") == "serve.session")
    assert {"ts", "level", "event", "run_id", "agent_path", "comp", "pid"} <= set(line)


async def test_events_needs_the_bearer_and_survives_a_hostile_upgrade():
    env = {"SERVE_TOKEN": "serve-token-1234"}
    async with trio.open_nursery() as nursery:
        base, latch, _ = await _serving(nursery, ["--intelligence", "test", "--serve-mcp", "http://127.0.0.1:0/mcp",
                                                  "--serve-bearer", "{{secret:SERVE_TOKEN}}"], env)
        ws_url = base.replace("http://", "ws://") + "/events"
        port = int(base.rsplit(":", 1)[1])
        # without the token, or with a wrong one: HTTP 403 before the WebSocket handshake
        for auth in (b"", b"Authorization: Bearer wrong-token-99\r\n"):
            assert (await _upgrade(port, auth)).startswith(b"HTTP/1.1 403")
        assert (await _upgrade(port, b"Authorization: Bearer serve-token-1234\r\n")).startswith(b"HTTP/1.1 101")
        async with open_websocket_url(ws_url, extra_headers=[(b"authorization", b"Bearer serve-token-1234")]) as ws:
            await ws.send_message("ignored")
        # GET /events with Upgrade: websocket and one trailing byte: that connection fails, the daemon does not
        for trailing in (b"", b"x"):
            sock = await trio.open_tcp_stream("127.0.0.1", port)
            async with sock:
                await sock.send_all(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
                                    b"Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                    b"Sec-WebSocket-Version: 13\r\n\r\n" + trailing)
                with trio.move_on_after(5):
                    await sock.receive_some(65536)
        async with httpx.AsyncClient() as client:
            assert (await client.get(base + "/healthz")).status_code == 200
            assert (await client.get(base + "/readyz")).status_code == 200
            assert (await client.get(base + "/events")).status_code == 404  # plain GET: no stream
        latch.request("test")


async def _upgrade(port: int, extra: bytes) -> bytes:
    """The first bytes of the answer to a raw WebSocket upgrade request for /events."""
    sock = await trio.open_tcp_stream("127.0.0.1", port)
    async with sock:
        await sock.send_all(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" + extra
                            + b"\r\n")
        with trio.fail_after(10):
            return await sock.receive_some(65536)


async def test_agentd_top_draws_the_tree_in_a_pty_and_quits_on_q():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    async with scripted_gateway([text("done", usage={"prompt_tokens": 3, "completion_tokens": 2})]) as gw, \
            trio.open_nursery() as nursery:
        base, latch, events = await _serving(nursery, ["--instruction", "go", "--intelligence", gw.url,
                                                       "--serve-mcp", "http://127.0.0.1:0/mcp"], {})
        await until(lambda: any(e["event"] == "run.end" for e in events), timeout=20, what="run.end")
        master, slave = os.openpty()
        proc = await trio.lowlevel.open_process([sys.executable, "-m", "agentd", "top", base + "/mcp"], cwd=root,
                                                stdin=slave, stdout=slave, stderr=subprocess.PIPE)
        os.close(slave)
        screen = b""
        async with trio.lowlevel.FdStream(master) as tty_stream:
            with trio.fail_after(30):
                while b"completed" not in screen or b"connected" not in screen:
                    screen += await tty_stream.receive_some(65536)
                await tty_stream.send_all(b" ")  # collapse the root: still drawn, marked +
                while b"+0" not in screen:
                    screen += await tty_stream.receive_some(65536)
                await tty_stream.send_all(b"q")
                assert await proc.wait() == 0
        latch.request("test")
    assert b"agentd top" in screen and b"steps" in screen
