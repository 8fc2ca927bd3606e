"""Push delivery of the served Events extension (``events/stream``, 2026-07-28 wire).

Against a real ``agentd --serve-mcp`` process (scripted gateway as its model), driven by a raw httpx client:

- a stream confirms its subscription (``notifications/events/active``), then delivers each served run's end as it
  happens (``notifications/events/event`` with the cursor after it), every frame naming the stream's request id;
- SIGKILL of the server while a stream is live: a new stream opened with the last cursor the old one delivered
  finds every later event once (the log and its cursors are in the journal, ``--state-dir``);
- a principal's stream delivers its own runs' events only; it holds at most ``SERVE_EVENTS_STREAMS_PER_PRINCIPAL``
  streams; one more is the extension's
  ResourceExhausted (``-32013``) answered as plain JSON, and another principal is not affected;
- a refused stream (bad cursor, unknown type, undeclared extension) is a JSON-RPC error with no stream opened.

In memory, on trio's autojump clock (the ASGI app with no sockets): a quiet stream sends a heartbeat with its
cursor every ``SERVE_EVENTS_HEARTBEAT`` seconds; drain ends it with the final ``StreamEventsResult``; a reader that
takes no frame for ``SERVE_EVENTS_SEND_TIMEOUT`` seconds has its stream ended and its slot released, and while it
stalls the stream holds at most one read's worth of frames whatever the number of events emitted.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agentd import defaults
from agentd.mcp import served_events as wire
from agentd.mcp.sse import SseDecoder
from agentd.selfmcp.surface import AgentInfo, SelfMcpSurface
from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
from agentd.transport.tenancy import LOCAL_KEY
from tests.integration.agents import agentd_worker
from tests.peers.gateway import scripted_gateway, text
from tests.security.idp import idp
from tests.selfmcp.backend import TaskBackend
from tests.selfmcp.harness import MODERN, LegacyPeer, decode_reply, modern_headers, rpc
from tests.selfmcp.test_asgi_clock import Exchange
from tests.waiting import until

EXTENSION = "io.modelcontextprotocol/events"
SUB = "io.modelcontextprotocol/subscriptionId"
FINISHED = "subagent.finished"


def _params(extension: bool = True, **params: Any) -> dict[str, Any]:
    caps = {"extensions": {EXTENSION: {}}} if extension else {}
    return {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                                "io.modelcontextprotocol/clientCapabilities": caps}}


class Frames:
    """The JSON frames of one open SSE response, read as they come."""

    def __init__(self, response: httpx.Response) -> None:
        self.chunks: AsyncIterator[bytes] = response.aiter_bytes()
        self.decoder = SseDecoder()
        self.ready: list[dict[str, Any]] = []

    async def next(self) -> dict[str, Any]:
        while not self.ready:
            chunk = await self.chunks.__anext__()
            self.ready.extend(json.loads(e.data) for e in self.decoder.feed(chunk) if e.data)
        return self.ready.pop(0)

    async def next_event(self) -> dict[str, Any]:
        """The next ``notifications/events/event`` (heartbeats skipped)."""
        while True:
            frame = await self.next()
            if frame.get("method") != "notifications/events/heartbeat":
                assert frame["method"] == "notifications/events/event", frame
                return dict(frame["params"])


async def _spawn_async(peer: LegacyPeer, instruction: str) -> str:
    answer = await peer.call("tools/call", {"name": "subagent.spawn",
                                            "arguments": {"instruction": instruction, "async": True}})
    return str(answer["result"]["structuredContent"]["handle"])


async def test_a_stream_delivers_as_runs_end_and_resumes_after_sigkill(tmp_path: Path) -> None:
    async with scripted_gateway(default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url,
                "--state-dir", str(tmp_path / "state"), "--drain-timeout", "3", "--cancel-grace", "1"]
        handles: list[str] = []
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            with trio.fail_after(60):
                peer = LegacyPeer(client, url)
                await peer.initialize()
                async with client.stream("POST", url, headers=modern_headers("events/stream"),
                                         json=rpc("events/stream", _params(name=FINISHED, cursor=None), "s1")) as r:
                    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                    frames = Frames(r)
                    active = await frames.next()
                    assert active["method"] == "notifications/events/active", active
                    assert active["params"]["truncated"] is False and active["params"]["_meta"] == {SUB: "s1"}
                    start = active["params"]["cursor"]
                    handles.append(await _spawn_async(peer, "say fine"))
                    first = await frames.next_event()
                    assert first["name"] == FINISHED and first["data"]["handle"] == handles[0], first
                    assert first["data"]["status"] == "completed" and first["_meta"] == {SUB: "s1"}
                    assert {"eventId", "timestamp", "cursor"} <= set(first)
                    kept = first["cursor"]  # what the reader persisted last
                    # Two more runs end while the stream is live, then the server dies with it open.
                    handles.append(await _spawn_async(peer, "say fine"))
                    handles.append(await _spawn_async(peer, "say fine"))
                    await frames.next_event()
                    os.kill(worker.pid, signal.SIGKILL)
                    with pytest.raises((httpx.HTTPError, StopAsyncIteration)):
                        while True:  # the stream breaks (whatever was still in flight is read first)
                            await frames.next()

        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            with trio.fail_after(60):
                async with client.stream("POST", url, headers=modern_headers("events/stream"),
                                         json=rpc("events/stream", _params(name=FINISHED, cursor=kept), 7)) as r:
                    frames = Frames(r)
                    active = await frames.next()
                    assert active["params"] == {"cursor": kept, "truncated": False, "_meta": {SUB: 7}}, active
                    resumed = [await frames.next_event(), await frames.next_event()]
                    # Both ends (in the order they happened; one may have ended only after the restart, its
                    # run resumed from the journal), once each, whatever the dead stream had delivered of them.
                    assert sorted(e["data"]["handle"] for e in resumed) == sorted(handles[1:]), resumed
                    peer = LegacyPeer(client, url)
                    await peer.initialize()
                    handles.append(await _spawn_async(peer, "say fine"))
                    late = await frames.next_event()
                    assert late["data"]["handle"] == handles[3], late
                # From the very first cursor: every event exactly once, in order (a poll reads the same log).
                answer = decode_reply(await client.post(url, headers=modern_headers("events/poll"), json=rpc(
                    "events/poll", _params(name=FINISHED, cursor=start))))
                seen = [e["data"]["handle"] for e in answer["result"]["events"]]
                assert seen == [handles[0], *(e["data"]["handle"] for e in resumed), handles[3]], answer
                assert len({e["eventId"] for e in answer["result"]["events"]}) == 4, answer


async def test_streams_are_per_principal_capped_and_refusals_open_no_stream() -> None:
    cap = defaults.SERVE_EVENTS_STREAMS_PER_PRINCIPAL
    async with idp() as authority, scripted_gateway(default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-oauth-issuer", authority.issuer,
                "--intelligence", gw.url]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            auth = {sub: {"authorization": f"Bearer {authority.mint(aud=url, sub=sub)}"} for sub in ("alice", "bob", "carol")}
            with trio.fail_after(60):
                async def post(who: str, params: dict[str, Any]) -> dict[str, Any]:
                    r = await client.post(url, headers={**modern_headers("events/stream"), **auth[who]},
                                          json=rpc("events/stream", params))
                    assert r.headers["content-type"].startswith("application/json"), r.headers
                    return decode_reply(r)

                refused = [
                    (_params(name=FINISHED, cursor="not-a-cursor"), -32602),
                    (_params(name="no.such.event"), wire.NOT_FOUND),
                    (_params(extension=False, name=FINISHED), -32021),
                ]
                for params, code in refused:
                    answer = await post("alice", params)
                    assert answer["error"]["code"] == code, (params, answer)
                start_bob = decode_reply(await client.post(
                    url, headers={**modern_headers("events/poll"), **auth["bob"]},
                    json=rpc("events/poll", _params(name=FINISHED))))["result"]["cursor"]

                # Per principal: bob's run ends first (its event is in the log before carol's), yet carol's
                # stream delivers hers only.
                async with client.stream("POST", url, headers={**modern_headers("events/stream"), **auth["carol"]},
                                         json=rpc("events/stream", _params(name=FINISHED), "c")) as r:
                    frames = Frames(r)
                    assert (await frames.next())["method"] == "notifications/events/active"
                    bob, carol = LegacyPeer(client, url, headers=auth["bob"]), LegacyPeer(client, url, headers=auth["carol"])
                    await bob.initialize()
                    await carol.initialize()
                    theirs = await _spawn_async(bob, "say fine")
                    async def bob_sees_it() -> bool:  # bob sees his own event (so it is in the log)
                        answer = await client.post(url, headers={**modern_headers("events/poll"), **auth["bob"]},
                                                   json=rpc("events/poll", _params(name=FINISHED, cursor=start_bob)))
                        return bool(decode_reply(answer)["result"]["events"])

                    await until(bob_sees_it, timeout=60, what="bob's own subagent.finished")
                    mine = await _spawn_async(carol, "say fine")
                    event = await frames.next_event()
                    assert event["data"]["handle"] == mine != theirs, event

                opened: list[trio.CancelScope] = []
                ready = trio.Semaphore(0)
                refusals: list[dict[str, Any]] = []

                async def hold(who: str) -> None:
                    """Open a stream and keep it (released on ``ready``), or record the refusal."""
                    with trio.CancelScope() as scope:
                        opened.append(scope)
                        async with client.stream("POST", url, headers={**modern_headers("events/stream"), **auth[who]},
                                                 json=rpc("events/stream", _params(name=FINISHED))) as r:
                            if r.headers["content-type"].startswith("application/json"):
                                refusals.append(json.loads(await r.aread()))
                                ready.release()
                                return
                            frames = Frames(r)  # kept: a dropped reader closes the response when collected
                            assert (await frames.next())["method"] == "notifications/events/active"
                            ready.release()
                            await trio.sleep_forever()

                async with trio.open_nursery() as nursery:
                    for _ in range(cap):
                        nursery.start_soon(hold, "alice")
                    for _ in range(cap):
                        await ready.acquire()
                    assert refusals == []
                    over = await post("alice", _params(name=FINISHED))
                    assert over["error"]["code"] == wire.RESOURCE_EXHAUSTED, over
                    assert over["error"]["data"] == {"limit": "streams", "max": cap}, over
                    nursery.start_soon(hold, "bob")  # another principal is not affected
                    await ready.acquire()
                    assert refusals == []
                    opened[0].cancel()  # alice closes one: room for one more of hers once the server sees it go
                    while True:
                        nursery.start_soon(hold, "alice")
                        await ready.acquire()
                        if not refusals:
                            break
                        assert refusals.pop()["error"]["code"] == wire.RESOURCE_EXHAUSTED
                        await trio.sleep(0.05)  # real time: the server sees the closed stream go only after its reader does
                    nursery.cancel_scope.cancel()


# -- in memory, on the autojump clock ------------------------------------------------------------------------

async def _app(nursery: trio.Nursery) -> tuple[SelfMcpSurface, McpAsgiApp]:
    surface = SelfMcpSurface(TaskBackend(nursery), AgentInfo("r", "loop"))
    await nursery.start(surface.run)
    return surface, McpAsgiApp(surface, AsgiOptions())


def _frames(ex: Exchange) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in SseDecoder().feed(ex.stream()) if e.data]


def _stream_exchange(cursor: str | None = None) -> Exchange:
    body = json.dumps(rpc("events/stream", _params(name=FINISHED, cursor=cursor), 5)).encode()
    return Exchange("POST", modern_headers("events/stream"), body)


async def test_heartbeats_carry_the_cursor_and_drain_ends_with_the_final_frame(autojump_clock: object) -> None:
    beat = defaults.SERVE_EVENTS_HEARTBEAT
    async with trio.open_nursery() as nursery:
        surface, app = await _app(nursery)
        ex = _stream_exchange()
        nursery.start_soon(app, ex.scope, ex.receive, ex.send)
        await trio.sleep(beat - 0.1)
        [active] = _frames(ex)
        assert active["method"] == "notifications/events/active"
        await surface.events.emit(FINISHED, LOCAL_KEY, {"handle": "served.1", "status": "completed"})
        await trio.sleep(0.2)
        _, event = _frames(ex)
        assert event["method"] == "notifications/events/event" and event["params"]["data"]["handle"] == "served.1"
        await trio.sleep(beat)  # quiet: one heartbeat, at the position of the last event
        heartbeat = _frames(ex)[-1]
        assert heartbeat == {"jsonrpc": "2.0", "method": "notifications/events/heartbeat",
                             "params": {"cursor": event["params"]["cursor"], "_meta": {SUB: 5}}}
        await trio.sleep(beat * 2)
        assert [f["method"] for f in _frames(ex)].count("notifications/events/heartbeat") == 3
        app.drain()
        await trio.sleep(0.1)
        assert _frames(ex)[-1] == {"jsonrpc": "2.0", "id": 5, "result": {"resultType": "complete",
                                                                         "_meta": {SUB: 5}}}
        assert ex.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        assert surface.events.streams == {}  # released
        nursery.cancel_scope.cancel()


class StalledReader(Exchange):
    """A reader that takes the first ``take`` messages, then never another (a full TCP window, a dead peer)."""

    def __init__(self, take: int) -> None:
        body = json.dumps(rpc("events/stream", _params(name=FINISHED, cursor=None), 5)).encode()
        super().__init__("POST", modern_headers("events/stream"), body)
        self.take = take

    async def send(self, message: dict[str, Any]) -> None:
        if len(self.sent) >= self.take and message.get("more_body", False):
            await trio.sleep_forever()
        await super().send(message)


async def test_a_stalled_reader_holds_one_read_at_most_and_is_ended(autojump_clock: object) -> None:
    async with trio.open_nursery() as nursery:
        surface, app = await _app(nursery)
        ex = StalledReader(take=2)  # the response start and the ``active`` frame
        nursery.start_soon(app, ex.scope, ex.receive, ex.send)
        await trio.sleep(1)
        assert surface.events.streams == {LOCAL_KEY: 1}
        [stream] = surface.events.open
        started = trio.current_time()
        for n in range(1000):
            await surface.events.emit(FINISHED, LOCAL_KEY, {"handle": f"served.{n}", "status": "completed"})
        await trio.sleep(1)
        assert len(stream.pending) <= wire.MAX_EVENTS + 1  # never a copy of the log
        await trio.sleep(defaults.SERVE_EVENTS_SEND_TIMEOUT)
        assert surface.events.streams == {}, "the stalled stream was ended and its slot released"
        assert stream.closed and not stream.pending
        assert trio.current_time() - started <= defaults.SERVE_EVENTS_SEND_TIMEOUT + 2
        nursery.cancel_scope.cancel()

