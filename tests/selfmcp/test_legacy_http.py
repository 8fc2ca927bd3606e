"""The legacy (2025-11-25) wire over real sockets: sessions, versions, batches, the GET stream, resumption."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from agentd.mcp.sse import SseDecoder
from tests.selfmcp.harness import ACCEPT, LegacyPeer, Served, read_events, rpc, serving
from tests.waiting import until


async def test_initialize_declares_exactly_the_surface() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        peer = LegacyPeer(client, s.url)
        result = await peer.initialize()
        assert result["protocolVersion"] == "2025-11-25"
        assert result["capabilities"] == {"tools": {}, "resources": {"subscribe": True}}
        assert result["serverInfo"]["name"] == "agentd"
        assert set(result) == {"protocolVersion", "capabilities", "serverInfo"}
        assert (await peer.call("ping"))["result"] == {}


async def test_version_negotiation_echoes_known_and_counters_unknown() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        for offered, expected in [("2025-06-18", "2025-06-18"), ("2024-11-05", "2024-11-05"),
                                  ("2026-07-28", "2025-11-25"), ("1999-01-01", "2025-11-25")]:
            r = await client.post(s.url, headers=ACCEPT, json=rpc("initialize", {
                "protocolVersion": offered, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}))
            assert r.status_code == 200
            assert r.json()["result"]["protocolVersion"] == expected


async def test_session_rules_400_404_delete() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        r = await client.post(s.url, headers=ACCEPT, json=rpc("tools/list"))
        assert r.status_code == 400
        r = await client.post(s.url, headers={**ACCEPT, "mcp-session-id": "nope"}, json=rpc("tools/list"))
        assert r.status_code == 404
        peer = LegacyPeer(client, s.url)
        await peer.initialize()
        assert (await peer.post("tools/list")).status_code == 200
        d = await client.delete(s.url, headers={"mcp-session-id": peer.session})
        assert d.status_code == 200
        assert (await peer.post("tools/list")).status_code == 404
        d = await client.delete(s.url, headers={"mcp-session-id": peer.session})
        assert d.status_code == 404


async def test_protocol_version_header_checks() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        peer = LegacyPeer(client, s.url)
        await peer.initialize()
        headers = peer.headers()
        headers["mcp-protocol-version"] = "2020-01-01"
        r = await client.post(s.url, headers=headers, json=rpc("tools/list"))
        assert r.status_code == 400
        del headers["mcp-protocol-version"]  # missing: the session's own version is known
        r = await client.post(s.url, headers=headers, json=rpc("tools/list"))
        assert r.status_code == 200


async def test_batches_only_for_2025_03_26() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        new = LegacyPeer(client, s.url)
        await new.initialize()
        batch = [rpc("ping", id=1), rpc("tools/list", id=2)]
        r = await client.post(s.url, headers=new.headers(), json=batch)
        assert r.status_code == 400
        old = LegacyPeer(client, s.url, version="2025-03-26")
        await old.initialize()
        r = await client.post(s.url, headers=old.headers(), json=[*batch, rpc("notifications/cancelled", {}, None)])
        assert r.status_code == 200
        answers = {a["id"]: a for a in r.json()}
        assert answers[1]["result"] == {}
        assert len(answers[2]["result"]["tools"]) == 5


async def test_notifications_and_responses_get_202_and_cancel_is_ignored() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        peer = LegacyPeer(client, s.url)
        await peer.initialize()
        r = await client.post(s.url, headers=peer.headers(),
                              json=rpc("notifications/cancelled", {"requestId": 1}, None))
        assert r.status_code == 202
        assert r.content == b""
        r = await client.post(s.url, headers=peer.headers(), json={"jsonrpc": "2.0", "id": 9, "result": {}})
        assert r.status_code == 202


async def test_malformed_json_and_bad_accept() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        r = await client.post(s.url, headers=ACCEPT, content=b"{not json")
        assert r.status_code == 400
        assert r.json()["error"]["code"] == -32700
        r = await client.post(s.url, headers={"content-type": "application/json", "accept": "application/json"},
                              json=rpc("ping"))
        assert r.status_code == 406


async def test_answers_at_url_path_and_at_mcp() -> None:
    async with serving(path="/agent") as s, httpx.AsyncClient() as client:
        base = s.url.rsplit("/", 1)[0]
        for path in ("/agent", "/mcp"):
            assert (await LegacyPeer(client, base + path).initialize())["serverInfo"]["name"] == "agentd"
        r = await client.post(base + "/other", headers=ACCEPT, json=rpc("ping"))
        assert r.status_code == 404


async def test_get_stream_priming_updated_and_resumption() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        peer = LegacyPeer(client, s.url)
        await peer.initialize()
        spawned = (await peer.call("tools/call", {"name": "subagent.spawn",
                                                  "arguments": {"instruction": "sleep=0.3", "async": True}}))
        handle = spawned["result"]["structuredContent"]["handle"]
        uri = f"agent://subagent/{handle}"
        assert (await peer.call("resources/subscribe", {"uri": uri}))["result"] == {}
        decoder = SseDecoder()
        with trio.fail_after(5):
            async with client.stream("GET", s.url, headers={**peer.headers(), "accept": "text/event-stream"}) as r:
                assert r.status_code == 200
                events = await read_events(r.aiter_bytes(), decoder, 1)
        priming = events[0]
        assert priming.data == "" and priming.id is not None and priming.retry is not None
        updated = next(e for e in events if e.data)
        assert json.loads(updated.data) == {"jsonrpc": "2.0", "method": "notifications/resources/updated",
                                            "params": {"uri": uri}}
        # resume from the priming event: the update is replayed with the same id
        headers = {**peer.headers(), "accept": "text/event-stream", "last-event-id": priming.id}
        with trio.fail_after(5):
            async with client.stream("GET", s.url, headers=headers) as r:
                again = await read_events(r.aiter_bytes(), SseDecoder(), 1)
        assert [e.id for e in again if e.data] == [updated.id]
        body = (await peer.call("resources/read", {"uri": uri}))["result"]["contents"][0]
        assert json.loads(body["text"])["status"] == "completed"


async def test_second_get_stream_conflicts() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        peer = LegacyPeer(client, s.url)
        await peer.initialize()
        headers = {**peer.headers(), "accept": "text/event-stream"}
        with trio.fail_after(5):
            async with client.stream("GET", s.url, headers=headers) as r:
                assert r.status_code == 200
                second = await client.get(s.url, headers=headers)
                assert second.status_code == 409


async def test_delete_ends_the_open_get_stream_and_drops_subscriptions() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        peer = LegacyPeer(client, s.url)
        await peer.initialize()
        spawned = await peer.call("tools/call", {"name": "subagent.spawn",
                                                 "arguments": {"instruction": "sleep=5", "async": True}})
        uri = "agent://subagent/" + spawned["result"]["structuredContent"]["handle"]
        await peer.call("resources/subscribe", {"uri": uri})
        assert s.surface.subscriptions.count() == 1
        with trio.fail_after(5):
            async with client.stream("GET", s.url, headers={**peer.headers(), "accept": "text/event-stream"}) as r:
                chunks = r.aiter_bytes()
                await chunks.__anext__()  # the priming event
                d = await client.delete(s.url, headers={"mcp-session-id": peer.session})
                assert d.status_code == 200
                rest = b"".join([c async for c in chunks])  # the stream ends
        assert b"data: {" not in rest
        assert s.surface.subscriptions.count() == 0


async def test_a_failing_backend_is_32603_for_that_request_only() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        peer = LegacyPeer(client, s.url)
        await peer.initialize()

        def broken() -> dict:
            raise RuntimeError("backend bug")

        s.backend.counts = broken  # type: ignore[method-assign]
        r = await peer.call("tools/call", {"name": "status", "arguments": {}})
        assert r["error"]["code"] == -32603 and "backend bug" not in json.dumps(r)
        assert (await peer.call("ping"))["result"] == {}


async def _sync_spawn_then_cancel(s: Served, client: httpx.AsyncClient, instruction: str, *, close_first: bool,
                                  ) -> dict[str, Any] | None:
    """A sync ``subagent.spawn`` (request id 5) on a legacy session, then ``notifications/cancelled`` naming it:
    after the peer dropped the stream (what a cancelled client does first), or while it is still open."""
    peer = LegacyPeer(client, s.url)
    init = await peer.initialize()
    assert init["capabilities"] == {"tools": {}, "resources": {"subscribe": True}}  # the flag changes no capability
    other = LegacyPeer(client, s.url)
    await other.initialize()
    body = rpc("tools/call", {"name": "subagent.spawn", "arguments": {"instruction": instruction}}, 5)
    answer = None
    cancel = rpc("notifications/cancelled", {"requestId": 5, "reason": "the parent was cancelled"}, None)
    async with client.stream("POST", s.url, headers=peer.headers(), json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        await until(lambda: s.backend.runs, timeout=10, what="the run started")
        # Another session's notification naming the same id, and one naming another id, cancel nothing.
        assert (await client.post(s.url, headers=other.headers(), json=cancel)).status_code == 202
        wrong = rpc("notifications/cancelled", {"requestId": 6}, None)
        assert (await client.post(s.url, headers=peer.headers(), json=wrong)).status_code == 202
        if not close_first:
            assert (await client.post(s.url, headers=peer.headers(), json=cancel)).status_code == 202
            events = [e for e in SseDecoder().feed(await r.aread()) if e.data]
            answer = json.loads(events[-1].data)
    if close_first:
        assert (await client.post(s.url, headers=peer.headers(), json=cancel)).status_code == 202
    await s.backend.runs["served.1"].done.wait()
    return answer


async def test_with_accept_cancel_a_cancelled_request_ends_its_run() -> None:
    for close_first in (True, False):
        async with serving(accept_cancel=True) as s, httpx.AsyncClient(timeout=10) as client:
            with trio.fail_after(10):
                answer = await _sync_spawn_then_cancel(s, client, "sleep=30", close_first=close_first)
            assert s.backend.cancelled == ["served.1"], close_first
            assert s.backend.runs["served.1"].view.status == "cancelled"
            if answer is not None:  # the stream was still open: the spawn answers with its run's end
                assert answer["result"]["structuredContent"]["status"] == "cancelled", answer


async def test_without_accept_cancel_the_notification_is_ignored() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(10):
            await _sync_spawn_then_cancel(s, client, "sleep=0.5", close_first=True)
        assert s.backend.cancelled == []
        assert s.backend.runs["served.1"].view.status == "completed"
