"""agentd.transport.events_app through the real server: ``/events`` is a WebSocket of JSON text frames behind
the listener's gate (refused before the handshake without it, or without a stream), a plain GET there is
404 and an upgrade elsewhere stays plain HTTP; a drain closes it with 1001."""

from __future__ import annotations

import json

import httpx
import trio
import wsproto.events

from agentd.telemetry.stream import EVENTS_PATH, EventBus, use_bus
from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
from tests.transport.served import EchoHandler, served, websocket

SOCKETS = frozenset({EVENTS_PATH})


async def test_event_lines_as_json_text_frames_until_a_drain_closes_with_1001() -> None:
    bus = EventBus()
    bus.publish({"event": "journal.opened", "path": "j.db"})  # sticky: a new subscriber sees it first
    app = McpAsgiApp(EchoHandler(), AsgiOptions(bearer="events-bearer"))
    with use_bus(bus):
        async with served(app, websocket_paths=SOCKETS) as s:
            async with websocket(s.port, EVENTS_PATH, {"authorization": "Bearer events-bearer"}) as ws:
                assert isinstance(ws.outcome, wsproto.events.AcceptConnection)
                assert json.loads(await ws.text())["event"] == "journal.opened"
                bus.publish({"event": "serve.session", "action": "created", "n": 7})
                while (line := json.loads(await ws.text())).get("event") != "serve.session":
                    pass
                assert line["n"] == 7
                app.drain()
                assert await ws.close_code() == 1001
            async with websocket(s.port, EVENTS_PATH, {"authorization": "Bearer events-bearer"}) as ws:
                assert isinstance(ws.outcome, wsproto.events.RejectConnection)  # draining: no new subscriber
                assert ws.outcome.status_code == 403


async def test_refused_before_the_handshake_without_the_gate_or_a_stream() -> None:
    app = McpAsgiApp(EchoHandler(), AsgiOptions(bearer="events-bearer"))
    with use_bus(EventBus()):
        async with served(app, websocket_paths=SOCKETS) as s:
            for headers, host in (({}, "127.0.0.1"), ({"authorization": "Bearer wrong"}, "127.0.0.1"),
                                  ({"authorization": "Bearer events-bearer"}, "evil.example"),
                                  ({"authorization": "Bearer events-bearer", "origin": "http://evil.example"},
                                   "127.0.0.1")):
                async with websocket(s.port, EVENTS_PATH, headers, host=host) as ws:
                    assert isinstance(ws.outcome, wsproto.events.RejectConnection)
                    assert ws.outcome.status_code == 403
    async with served(McpAsgiApp(EchoHandler()), websocket_paths=SOCKETS) as s:  # no stream in this process
        async with websocket(s.port, EVENTS_PATH) as ws:
            assert isinstance(ws.outcome, wsproto.events.RejectConnection) and ws.outcome.status_code == 403


async def test_a_plain_get_of_events_is_404_and_an_upgrade_elsewhere_stays_http() -> None:
    with use_bus(EventBus()):
        async with served(McpAsgiApp(EchoHandler()), websocket_paths=SOCKETS) as s:
            async with httpx.AsyncClient() as client:
                plain = await client.get(f"http://127.0.0.1:{s.port}{EVENTS_PATH}")
                assert (plain.status_code, plain.text) == (404, "not found")
            async with websocket(s.port, "/mcp") as ws:  # the MCP endpoint answers it as the GET it is
                assert isinstance(ws.outcome, wsproto.events.RejectConnection)
                assert ws.outcome.status_code not in (101, 403)
            async with websocket(s.port, "/healthz") as ws:
                assert isinstance(ws.outcome, wsproto.events.RejectConnection) and ws.outcome.status_code == 200
            with trio.fail_after(10):
                async with websocket(s.port, EVENTS_PATH) as ws:
                    assert isinstance(ws.outcome, wsproto.events.AcceptConnection)
