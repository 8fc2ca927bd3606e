"""A peer's garbage is a fault with a clear message, never a crash, a hang or unbounded memory.

A real hypercorn server on loopback plays a broken A2A peer: a valid card, then per message text a bad
reply (not JSON, not JSON-RPC, an oversized body, a broken event stream, a task of an unknown state, a
non-200 status, a JSON-RPC error).
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from hypercorn.trio import serve

from agentd.a2a.client import open_a2a_peers
from agentd.config.model import McpServerConfig
from agentd.errors import A2aError, A2aRpcError
from tests.client.helpers import Events
from tests.peers.asgi import Receive, Send, lifespan, read_body
from tests.peers.gateway import _hypercorn_config

LIMIT = 4096


class BrokenPeer:
    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.port = 0
        self.gets = self.cancels = self.subscribes = 0

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["method"] == "GET":
            card = {"name": "broken", "capabilities": {"streaming": self.streaming}, "supportedInterfaces": [
                {"url": f"http://127.0.0.1:{self.port}/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]}
            await self._reply(send, 200, json.dumps(card).encode())
            return
        request = json.loads(await read_body(receive))
        text = request["params"].get("message", {}).get("parts", [{}])[0].get("text", "")
        rid = request["id"]
        if await self._streams(request, text, send):
            return
        replies: dict[str, tuple[int, bytes, str]] = {
            "notjson": (200, b"<html>oops</html>", "application/json"),
            "notrpc": (200, b'{"hello": 1}', "application/json"),
            "huge": (200, json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"pad": "x" * (LIMIT * 4)}}).encode(),
                     "application/json"),
            "badstate": (200, json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"task": {
                "id": "t", "status": {"state": "TASK_STATE_EXPLODED"}}}}).encode(), "application/json"),
            "status500": (500, b"internal", "text/plain"),
            "rpcerror": (200, json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": -32004,
                                                                                 "message": "nope"}}).encode(),
                         "application/json"),
            "badsse": (200, b"data: {not json}\n\n", "text/event-stream"),
            "hugesse": (200, b"data: " + b"x" * (LIMIT * 4), "text/event-stream"),
            "wrongtype": (200, b"hello", "text/html"),
        }
        status, body, kind = replies.get(text, (200, b"{}", "application/json"))
        await self._reply(send, status, body, kind)

    async def _streams(self, request: dict[str, Any], text: str, send: Send) -> bool:
        """The hostile streams: endless status updates, endless artifact appends, a stream that always
        ends before the task does (and a task that GetTask then says is completed)."""
        rid, method = request["id"], request["method"]

        def frame(result: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode() + b"\n\n"

        task = {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_WORKING"}}
        if method == "GetTask":
            self.gets += 1
            done = {**task, "status": {"state": "TASK_STATE_COMPLETED"},
                    "artifacts": [{"artifactId": "a", "parts": [{"text": "finally"}]}]}
            await self._reply(send, 200, json.dumps({"jsonrpc": "2.0", "id": rid, "result": done}).encode())
            return True
        if method == "CancelTask":
            self.cancels += 1
            canceled = {**task, "status": {"state": "TASK_STATE_CANCELED"}}
            await self._reply(send, 200, json.dumps({"jsonrpc": "2.0", "id": rid, "result": canceled}).encode())
            return True
        if method not in ("SendStreamingMessage", "SubscribeToTask") or text not in ("endless", "flood", "cut", ""):
            return False
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": frame({"task": task}), "more_body": True})
        if method == "SubscribeToTask":
            self.subscribes += 1
        elif text in ("endless", "flood"):
            update = ({"statusUpdate": {"taskId": "t1", "contextId": "c1", "status": task["status"]}} if text == "endless"
                      else {"artifactUpdate": {"taskId": "t1", "contextId": "c1", "append": True,
                                               "artifact": {"artifactId": "a", "parts": [{"text": "y" * 500}]}}})
            while True:  # until the client goes away (the send fails) or the server stops
                await send({"type": "http.response.body", "body": frame(update), "more_body": True})
                await trio.sleep(0.002)  # real time: a peer's endless stream, paced so the client reads it
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    @staticmethod
    async def _reply(send: Send, status: int, body: bytes, kind: str = "application/json") -> None:
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind.encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


@asynccontextmanager
async def broken_peer(streaming: bool, app: BrokenPeer | None = None) -> AsyncIterator[str]:
    app = app or BrokenPeer(streaming)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, app, _hypercorn_config(0, None, None)))
        app.port = int(binds[0].rsplit(":", 1)[1])
        yield f"http://127.0.0.1:{app.port}"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("streaming", "text", "error"), [
    (False, "notjson", "not JSON"),
    (False, "notrpc", "not a JSON-RPC response"),
    (False, "huge", f"exceeds {LIMIT} bytes"),
    (False, "badstate", "unknown task state"),
    (False, "status500", "HTTP 500"),
    (False, "rpcerror", "A2A error -32004"),
    (True, "badsse", "an event is not JSON"),
    (True, "hugesse", "broken event stream"),
    (True, "wrongtype", "unexpected content type"),
    (True, "rpcerror", "A2A error -32004"),
])
async def test_garbage_is_a_clear_fault(streaming: bool, text: str, error: str) -> None:
    events = Events()
    async with broken_peer(streaming) as url:
        with trio.fail_after(20):
            async with open_a2a_peers([McpServerConfig("bad", url)], log=events.log, max_body=LIMIT) as peers:
                with pytest.raises(A2aError, match=error) as info:
                    await peers.delegate("bad", text, context_id=None)
                assert info.value.peer == "bad"
                if text == "rpcerror":
                    assert isinstance(info.value, A2aRpcError) and info.value.code == -32004


async def test_an_endless_stream_ends_at_call_timeout_and_the_task_is_cancelled() -> None:
    events, app = Events(), BrokenPeer(True)
    async with broken_peer(True, app) as url:
        with trio.fail_after(20):
            async with open_a2a_peers([McpServerConfig("bad", url, call_timeout=1.0)], log=events.log) as peers:
                with pytest.raises(trio.TooSlowError):
                    await peers.delegate("bad", "endless", context_id=None)
    assert app.cancels == 1 and [e["task_id"] for e in events.named("a2a.cancel")] == ["t1"]


async def test_endless_artifact_appends_are_bounded() -> None:
    events = Events()
    async with broken_peer(True) as url:
        with trio.fail_after(20):
            async with open_a2a_peers([McpServerConfig("bad", url)], log=events.log, max_body=LIMIT * 4) as peers:
                with pytest.raises(A2aError, match=f"streamed artifacts exceed {LIMIT * 4} bytes"):
                    await peers.delegate("bad", "flood", context_id=None)


async def test_a_stream_that_keeps_ending_early_is_resubscribed_a_bounded_number_of_times() -> None:
    events, app = Events(), BrokenPeer(True)
    async with broken_peer(True, app) as url:
        with trio.fail_after(20):
            async with open_a2a_peers([McpServerConfig("bad", url)], log=events.log) as peers:
                result = await peers.delegate("bad", "cut", context_id=None)
    assert result.state == "completed" and app.subscribes == 3 and app.gets == 1  # type: ignore[union-attr]
    assert [e["attempt"] for e in events.named("a2a.resubscribe")] == [1, 2, 3]


async def test_an_untrusted_peer_certificate_is_explained(tmp_path: Any) -> None:
    from tests.selfmcp.certs import make_pki

    pki = make_pki(tmp_path)
    app = BrokenPeer(False)
    config = _hypercorn_config(0, str(pki.server.cert), str(pki.server.key))
    events = Events()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, app, config))
        app.port = int(binds[0].rsplit(":", 1)[1])
        with trio.fail_after(20), pytest.raises(A2aError) as info:
            async with open_a2a_peers([McpServerConfig("tls", f"https://127.0.0.1:{app.port}")], log=events.log):
                pytest.fail("must not connect")
        nursery.cancel_scope.cancel()
    assert "A2A peer 'tls': unreachable" in str(info.value)
    assert "certificate verify failed" in str(info.value) and "not trusted" in str(info.value)
