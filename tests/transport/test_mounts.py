"""agentd.transport.mounts: the served surface as a table, through the real server: a path's app is the first
mount that claims it, ``under`` and ``slashes`` claim what they say and nothing more, anything else is 404,
and a WebSocket is served only where one is mounted (an upgrade elsewhere is plain HTTP)."""

from __future__ import annotations

import httpx
import pytest
import wsproto.events

from agentd.mcp.server_session import HttpReply
from agentd.transport.asgi import Receive, Scope, Send, send_reply
from agentd.transport.mounts import Mount, Mounts
from tests.transport.served import served, websocket


def named(name: str):  # type: ignore[no-untyped-def]
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send_reply(send, HttpReply(200, f"{name} {scope['path']}".encode(), "text/plain"))

    return app


async def echo_socket(scope: Scope, receive: Receive, send: Send) -> None:
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": f"on {scope['path']}"})
    await send({"type": "websocket.close", "code": 1000})


def table() -> Mounts:
    return Mounts(http=[
        Mount("/a", named("a")),
        Mount("/ui", named("ui"), under=True),
        Mount("/mcp", named("mcp"), slashes=True),
        Mount("/p", named("p"), under=True),
        Mount("/p/q", named("pq")),  # claimed by /p first: never reached
    ], websocket=[Mount("/ws", echo_socket)])


@pytest.mark.parametrize(("path", "answer"), [
    ("/a", "a"), ("/a/", None), ("/ab", None),
    ("/ui", "ui"), ("/ui/", "ui"), ("/ui/x/y.js", "ui"), ("/uix", None),
    ("/mcp", "mcp"), ("/mcp/", "mcp"), ("/mcp//", "mcp"), ("/mcp/x", None),
    ("/p/q", "p"), ("/", None), ("/nowhere", None),
])
async def test_the_first_mount_that_claims_a_path_answers_it(path: str, answer: str | None) -> None:
    async with served(table()) as s, httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.port}") as client:
        for method in ("GET", "POST"):
            response = await client.request(method, path)
            if answer is None:
                assert (response.status_code, response.text) == (404, "not found")
            else:
                assert (response.status_code, response.text) == (200, f"{answer} {path}")


async def test_a_mount_put_in_front_wins_where_both_claim_a_path() -> None:
    mounts = table()
    mounts.mount(Mount("/a", named("front"), slashes=True))
    async with served(mounts) as s, httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.port}") as client:
        assert (await client.get("/a")).text == "front /a"
        assert (await client.get("/a/")).text == "front /a/"
        assert (await client.get("/mcp")).text == "mcp /mcp"


async def test_a_websocket_only_where_one_is_mounted() -> None:
    async with served(table(), websocket_paths=frozenset({"/ws", "/unmounted"})) as s:
        async with websocket(s.port, "/ws") as ws:
            assert isinstance(ws.outcome, wsproto.events.AcceptConnection)
            assert await ws.text() == "on /ws"
            assert await ws.close_code() == 1000
        async with websocket(s.port, "/unmounted") as ws:  # upgraded by the server, refused by the table
            assert isinstance(ws.outcome, wsproto.events.RejectConnection) and ws.outcome.status_code == 403
        async with websocket(s.port, "/a") as ws:  # not a WebSocket path: the http table answers it
            assert isinstance(ws.outcome, wsproto.events.RejectConnection) and ws.outcome.status_code == 200
