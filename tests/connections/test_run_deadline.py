"""``deadlineMs`` bounds the whole run, connecting to the bound connections included."""

from __future__ import annotations

import functools

import trio

from tests.connections.helpers import connection, run
from tests.peers.gateway import scripted_gateway, text


async def _accept_and_never_answer(stream: trio.SocketStream) -> None:
    async with stream:
        await trio.sleep_forever()


async def test_deadline_covers_connecting_to_a_server_that_never_answers(tmp_path):
    manifest = {
        "connections": [{"ref": "docs", "alias": "docs"}],
        "steps": [{"id": "s", "type": "prompt", "prompt": "p"}],
        "limits": {"deadlineMs": 1000},
    }
    async with trio.open_nursery() as nursery, scripted_gateway([text("ok")]) as gw:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, _accept_and_never_answer, 0,
                                                          host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        config = {"intelligence": {"url": gw.url}, "transcript": {"enabled": False},
                  "connections": {"docs": connection(f"http://127.0.0.1:{port}/mcp", tools=["search"])}}
        # The pool's own connect timeouts are far longer than the 1 s deadline.
        with trio.fail_after(6):
            outcome = await run(tmp_path, config, manifest)
        nursery.cancel_scope.cancel()
    assert outcome.code == 7, outcome.raw
    assert outcome.doc["status"] == "deadline" and outcome.doc["error"]["code"] == "deadline"
    assert "while connecting" in outcome.doc["error"]["message"]
