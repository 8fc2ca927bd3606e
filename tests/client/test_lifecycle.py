"""The client's wire and lifecycle against scripted in-process peers: handshake bytes, headers, server
requests, 404 re-initialize, cancellation, pings, backoff, re-subscribe, stream resumption.

Time-based behaviour runs on trio's autojump clock; the peers run in the same trio run, on loopback.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from agentd import __version__
from agentd.client import Tuning, open_mcp_pool
from agentd.errors import McpConnectError, McpTransportError
from agentd.mcp.sse import encode_event
from tests.client.fakeserver import INIT_RESULT, Req, Resp, mcp_answer, result, serve_fake
from tests.client.helpers import Events, server


async def test_handshake_is_exactly_the_specified_exchange() -> None:
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, mcp_answer)
        async with open_mcp_pool([server(fake.url)], log=Events().log, run_id="run-7") as pool:
            await pool.call_tool("s", "t", {"a": 1}, idempotency_key="run-7/n/1.0")
            await pool.call_tool("s", "t", {"a": 1})  # no key given: a fresh one of its own
        nursery.cancel_scope.cancel()
    init, initialized = fake.requests[0], fake.requests[1]
    assert init.json == {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "agentd", "version": __version__}},
    }
    assert init.headers["accept"] == "application/json, text/event-stream"
    assert init.headers["content-type"] == "application/json"
    assert "mcp-protocol-version" not in init.headers and "mcp-session-id" not in init.headers
    assert initialized.json == {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert initialized.headers["mcp-session-id"] == "s-1"
    assert initialized.headers["mcp-protocol-version"] == "2025-11-25"
    call, unkeyed = (r for r in fake.requests if r.rpc_method == "tools/call")
    assert call.json["params"] == {"name": "t", "arguments": {"a": 1},
                                   "_meta": {"io.modelcontextprotocol/run-id": "run-7",
                                             "io.modelcontextprotocol/idempotency-key": "run-7/n/1.0"}}
    fresh = unkeyed.json["params"]["_meta"]["io.modelcontextprotocol/idempotency-key"]
    assert isinstance(fresh, str) and fresh and fresh != "run-7/n/1.0" and "idempotencyKey" not in unkeyed.json["params"]
    assert call.headers["mcp-session-id"] == "s-1"
    # Orderly close: DELETE with the session id.
    assert fake.requests[-1].method == "DELETE" and fake.requests[-1].headers["mcp-session-id"] == "s-1"


@pytest.mark.parametrize("version", ["2025-06-18", "2025-03-26", "2024-11-05"])
async def test_downgrades_are_accepted_and_sent_as_the_version_header(version: str) -> None:
    async def handler(req: Req, resp: Resp) -> None:
        await mcp_answer(req, resp, init={**INIT_RESULT, "protocolVersion": version})

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            assert pool.connections["s"].protocol_version == version
            await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()
    call = next(r for r in fake.requests if r.rpc_method == "tools/call")
    assert call.headers["mcp-protocol-version"] == version


async def test_server_requests_are_answered_ping_roots_and_minus_32601() -> None:
    async def handler(req: Req, resp: Resp) -> None:
        if req.rpc_method == "tools/call":
            await resp.start(200, {"content-type": "text/event-stream"})
            for i, method in enumerate(["ping", "roots/list", "sampling/createMessage"]):
                await resp.write(encode_event(f'{{"jsonrpc":"2.0","id":"srv-{i}","method":"{method}"}}'))
            await resp.write(encode_event(f'{{"jsonrpc":"2.0","id":{req.json["id"]},"result":{{"content":[]}}}}'))
            await resp.end()
        else:
            await mcp_answer(req, resp)

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            with trio.fail_after(10):
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()
    replies = {r.json["id"]: r.json for r in fake.requests if r.method == "POST" and "method" not in r.json}
    assert replies["srv-0"]["result"] == {}
    assert replies["srv-1"]["result"] == {"roots": []}
    assert replies["srv-2"]["error"]["code"] == -32601


async def test_404_on_the_session_reinitializes_and_retries() -> None:
    state = {"sessions": 0, "gone": True}

    async def handler(req: Req, resp: Resp) -> None:
        if req.rpc_method == "initialize":
            state["sessions"] += 1
            await mcp_answer(req, resp, session=f"s-{state['sessions']}")
        elif req.rpc_method == "tools/call" and state["gone"]:
            state["gone"] = False
            await resp.body(404, b"session not found", content_type="text/plain")
        else:
            await mcp_answer(req, resp)

    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        async with open_mcp_pool([server(fake.url)], log=events.log) as pool:
            with trio.fail_after(10):
                res = await pool.call_tool("s", "t", {})
            assert res.content == [{"type": "text", "text": "ok"}]
            assert pool.connections["s"].session_id == "s-2"
        nursery.cancel_scope.cancel()
    calls = [r for r in fake.requests if r.rpc_method == "tools/call"]
    assert [c.headers["mcp-session-id"] for c in calls] == ["s-1", "s-2"]


async def test_abandoned_request_sends_cancelled_shielded(autojump_clock: trio.abc.Clock) -> None:
    async def handler(req: Req, resp: Resp) -> None:
        if req.rpc_method == "tools/call":
            await trio.sleep_forever()
        await mcp_answer(req, resp)

    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        async with open_mcp_pool([server(fake.url)], log=events.log) as pool:
            with trio.move_on_after(5):
                await pool.call_tool("s", "t", {})
            call = next(r for r in fake.requests if r.rpc_method == "tools/call")
            cancelled = [r for r in fake.requests if r.rpc_method == "notifications/cancelled"]
            assert len(cancelled) == 1
            assert cancelled[0].json["params"] == {"requestId": call.json["id"], "reason": "the request was cancelled"}
        nursery.cancel_scope.cancel()
    assert events.named("mcp.cancelled")


async def test_call_timeout_is_a_transport_error_and_cancels(autojump_clock: trio.abc.Clock) -> None:
    async def handler(req: Req, resp: Resp) -> None:
        if req.rpc_method == "tools/call":
            await trio.sleep_forever()
        await mcp_answer(req, resp)

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        async with open_mcp_pool([server(fake.url, call_timeout=7.0)], log=Events().log) as pool:
            start = trio.current_time()
            with pytest.raises(McpTransportError, match="no answer within 7 s"):
                await pool.call_tool("s", "t", {})
            assert trio.current_time() - start == pytest.approx(7.0, abs=0.1)
        nursery.cancel_scope.cancel()
    assert "notifications/cancelled" in fake.methods()


async def test_three_missed_pings_mark_stale_and_reconnect(autojump_clock: trio.abc.Clock) -> None:
    state = {"inits": 0}

    async def handler(req: Req, resp: Resp) -> None:
        if req.rpc_method == "initialize":
            state["inits"] += 1
        if req.rpc_method == "ping" and state["inits"] == 1:
            await trio.sleep_forever()
        await mcp_answer(req, resp)

    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        async with open_mcp_pool([server(fake.url)], log=events.log) as pool:
            start = trio.current_time()
            with trio.fail_after(300):
                while state["inits"] < 2 or not pool.connections["s"].connected:
                    await trio.sleep(1)
            elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert [e["misses"] for e in events.named("mcp.ping_missed")] == [1, 2, 3]
    assert len(events.named("mcp.stale")) == 1
    # 30 s idle, 10 s timeout, three times (the next ping is due 30 s after the last attempt started).
    assert 3 * 40 - 1 <= elapsed <= 3 * 40 + 10
    # Pings went out after idleness only: none in the first 30 s.
    assert fake.methods().count("ping") >= 3


async def test_answered_pings_keep_the_connection(autojump_clock: trio.abc.Clock) -> None:
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, mcp_answer)
        async with open_mcp_pool([server(fake.url)], log=events.log):
            await trio.sleep(95)
        nursery.cancel_scope.cancel()
    assert fake.methods().count("ping") == 3
    assert not events.named("mcp.ping_missed") and not events.named("mcp.reconnect")


async def test_reconnect_backoff_resubscribe_and_one_synthesized_update(autojump_clock: trio.abc.Clock) -> None:
    async def with_stream(req: Req, resp: Resp) -> None:
        if req.method == "GET":
            await resp.start(200, {"content-type": "text/event-stream"})
            await trio.sleep_forever()
        await mcp_answer(req, resp)

    events = Events()
    tuning = Tuning(backoff_initial=0.5, backoff_max=8.0)
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, with_stream)
        port = int(fake.url.split(":")[2].split("/")[0])
        async with open_mcp_pool([server(fake.url)], log=events.log, tuning=tuning) as pool:
            assert await pool.subscribe("r://x")
            assert await pool.subscribe("r://y")
            fake.stop()
            with pytest.raises(McpTransportError):  # the call discovers the dead peer
                await pool.call_tool("s", "t", {})
            await trio.sleep(20)  # several failed attempts, backing off
            attempts = events.named("mcp.reconnect")
            delays = [e["delay"] for e in attempts]
            assert delays[0] == 0 and len(delays) >= 4
            for n, delay in enumerate(delays[1:], start=1):
                cap = min(8.0, 0.5 * 2 ** (n - 1))
                assert cap * 0.5 <= delay <= cap
            revived = await nursery.start(serve_fake, with_stream, port)
            updates = pool.updates()
            with trio.fail_after(60):
                got = {(await updates.receive()).uri, (await updates.receive()).uri}
            assert got == {"r://x", "r://y"}
            with trio.move_on_after(5):
                extra = await updates.receive()
                raise AssertionError(f"more than one synthesized update: {extra}")
        nursery.cancel_scope.cancel()
    subscribed = [r.json["params"]["uri"] for r in revived.requests if r.rpc_method == "resources/subscribe"]
    assert subscribed == ["r://x", "r://y"]
    assert [e["uri"] for e in events.named("mcp.updated") if e["synthesized"]] == ["r://x", "r://y"]


async def test_required_failure_raises_optional_failure_is_omitted() -> None:
    from tests.peers.launch import free_port

    dead = f"http://127.0.0.1:{free_port()}/mcp"
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, mcp_answer)
        async with open_mcp_pool([server(fake.url, "good"), server(dead, "opt", required=False)],
                                 log=events.log) as pool:
            assert list(pool.connections) == ["good"]
            assert isinstance(pool.failed["opt"], McpConnectError)
            assert [t.server for t in pool.tools()] == ["good"]
        with pytest.raises(McpConnectError) as info:
            async with open_mcp_pool([server(fake.url, "good"), server(dead, "req")], log=events.log):
                raise AssertionError("must not get here")
        assert info.value.server == "req"
        nursery.cancel_scope.cancel()
    failed = events.named("mcp.connect_failed")
    assert {(e["server"], e["required"], e["level"]) for e in failed} == {("opt", False, "warn"), ("req", True, "error")}


def _sse_handler(gets: list[tuple[float, str | None]], note_uri: str) -> Any:
    async def handler(req: Req, resp: Resp) -> None:
        if req.method == "GET":
            gets.append((trio.current_time(), req.headers.get("last-event-id")))
            n = len(gets)
            await resp.start(200, {"content-type": "text/event-stream"})
            await resp.write(encode_event("", id=f"ev-{n}", retry=2500))
            note = f'{{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{{"uri":"{note_uri}"}}}}'
            await resp.write(encode_event(note, id=f"ev-{n}b"))
            if n < 3:
                await resp.end()
            else:
                await trio.sleep_forever()
        else:
            await mcp_answer(req, resp)

    return handler


async def test_standing_get_stream_resumes_with_last_event_id(autojump_clock: trio.abc.Clock) -> None:
    gets: list[tuple[float, str | None]] = []
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, _sse_handler(gets, "r://x"))
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            updates = pool.updates()
            with trio.fail_after(30):
                for _ in range(3):
                    assert (await updates.receive()).uri == "r://x"
        nursery.cancel_scope.cancel()
    assert [g[1] for g in gets] == [None, "ev-1b", "ev-2b"]
    assert gets[1][0] - gets[0][0] == pytest.approx(2.5, abs=0.1)
    assert gets[2][0] - gets[1][0] == pytest.approx(2.5, abs=0.1)


async def test_post_stream_closed_early_is_resumed_over_get(autojump_clock: trio.abc.Clock) -> None:
    """The conformance ``sse-retry`` shape: priming id + retry, close, answer on GET + Last-Event-ID."""
    seen: list[tuple[float, str | None]] = []
    pending: dict[str, Any] = {}

    async def handler(req: Req, resp: Resp) -> None:
        if req.rpc_method == "initialize":
            await mcp_answer(req, resp, init={**INIT_RESULT, "capabilities": {"tools": {}}})
        elif req.rpc_method == "tools/call":
            pending["id"] = req.json["id"]
            await resp.start(200, {"content-type": "text/event-stream"})
            await resp.write(encode_event("", id="event-1", retry=500))
            await resp.end()
        elif req.method == "GET":
            seen.append((trio.current_time(), req.headers.get("last-event-id")))
            await resp.start(200, {"content-type": "text/event-stream"})
            answer = result(Req("POST", "/", {}, b'{"id": %d}' % pending["id"]), {"content": [], "isError": False})
            import json as _json

            await resp.write(encode_event(_json.dumps(answer), id="event-2"))
            await resp.end()
        else:
            await mcp_answer(req, resp)

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            start = trio.current_time()
            with trio.fail_after(10):
                res = await pool.call_tool("s", "t", {})
            assert res.is_error is False
        nursery.cancel_scope.cancel()
    assert len(seen) == 1
    assert seen[0][1] == "event-1"
    assert seen[0][0] - start == pytest.approx(0.5, abs=0.05)


async def test_subscribe_degrades_without_a_get_stream() -> None:
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, mcp_answer)  # advertises subscribe, answers GET with 405
        async with open_mcp_pool([server(fake.url)], log=events.log) as pool:
            assert pool.connections["s"].stream_offered is False
            assert await pool.subscribe("r://x") is False
        nursery.cancel_scope.cancel()
    assert "resources/subscribe" not in fake.methods()
    assert events.named("mcp.subscribe_degraded")[0]["error"] == "the server offers no GET stream"


async def test_read_resource_finds_the_owner_across_servers() -> None:
    from agentd.errors import ResourceNotFound

    async def only_b(req: Req, resp: Resp) -> None:
        if req.rpc_method == "resources/read" and not req.json["params"]["uri"].startswith("r://b"):
            await resp.json({"jsonrpc": "2.0", "id": req.json["id"],
                             "error": {"code": -32002, "message": "not found", "data": {"uri": "x"}}})
        elif req.rpc_method == "resources/list":
            await resp.json(result(req, {"resources": [{"uri": "r://b", "name": "b"}]}))
        else:
            await mcp_answer(req, resp)

    async def nothing(req: Req, resp: Resp) -> None:
        if req.rpc_method == "resources/read":
            await resp.json({"jsonrpc": "2.0", "id": req.json["id"], "error": {"code": -32002, "message": "nope"}})
        else:
            await mcp_answer(req, resp)

    async with trio.open_nursery() as nursery:
        a = await nursery.start(serve_fake, nothing)
        b = await nursery.start(serve_fake, only_b)
        async with open_mcp_pool([server(a.url, "a"), server(b.url, "b")], log=Events().log) as pool:
            with trio.fail_after(10):
                listed = await pool.read_resource("r://b")  # listed by b: asked there first
                assert listed.server == "b"
                unlisted = await pool.read_resource("r://b-only-by-asking")  # a says not found, then b
                assert unlisted.server == "b"
                with pytest.raises(ResourceNotFound) as info:
                    await pool.read_resource("r://nowhere", server="a")
                assert info.value.uri == "r://nowhere" and info.value.server == "a"
        nursery.cancel_scope.cancel()
    reads_on_a = [r.json["params"]["uri"] for r in a.requests if r.rpc_method == "resources/read"]
    assert "r://b" not in reads_on_a and "r://b-only-by-asking" in reads_on_a


async def test_a_2025_03_26_batch_in_one_event_is_accepted() -> None:
    async def handler(req: Req, resp: Resp) -> None:
        if req.rpc_method == "initialize":
            await mcp_answer(req, resp, init={**INIT_RESULT, "protocolVersion": "2025-03-26"})
        elif req.rpc_method == "tools/call":
            batch = [{"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "r://x"}},
                     result(req, {"content": [{"type": "text", "text": "batched"}]})]
            import json as _json

            await resp.start(200, {"content-type": "text/event-stream"})
            await resp.write(encode_event(_json.dumps(batch)))
            await resp.end()
        else:
            await mcp_answer(req, resp)

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            with trio.fail_after(10):
                res = await pool.call_tool("s", "t", {})
                assert res.content[0]["text"] == "batched"
                assert (await pool.updates().receive()).uri == "r://x"
        nursery.cancel_scope.cancel()


async def test_updates_channel_ends_with_the_pool() -> None:
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, mcp_answer)
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            updates = pool.updates()
        with trio.fail_after(5), pytest.raises(trio.EndOfChannel):
            await updates.receive()
        nursery.cancel_scope.cancel()
