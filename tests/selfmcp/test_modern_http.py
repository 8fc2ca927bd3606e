"""The 2026-07-28 wire on the same endpoint: discover, envelope/header checks, resultType, listen."""

from __future__ import annotations

import base64
import json

import httpx
import trio

from agentd.mcp.sse import SseDecoder
from tests.selfmcp.harness import (
    ACCEPT,
    MODERN,
    decode_reply,
    modern_headers,
    modern_meta,
    read_events,
    rpc,
    serving,
)
from tests.waiting import until


def _params(**extra: object) -> dict:
    return {"_meta": modern_meta(), **extra}


async def _post(client: httpx.AsyncClient, url: str, method: str, params: dict, *, name: str | None = None,
                id: int = 1) -> httpx.Response:
    return await client.post(url, headers=modern_headers(method, name), json=rpc(method, params, id))


async def test_discover_and_result_decoration() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        r = await _post(client, s.url, "server/discover", _params())
        assert r.status_code == 200 and "mcp-session-id" not in r.headers
        result = r.json()["result"]
        assert result["supportedVersions"] == [MODERN, "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]
        assert result["capabilities"] == {"tools": {}, "resources": {"subscribe": True},
                                          "extensions": {"io.modelcontextprotocol/tasks": {},
                                                         "io.modelcontextprotocol/events": {}}}
        assert result["resultType"] == "complete" and result["ttlMs"] == 0 and result["cacheScope"] == "private"
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "agentd"
        tools = (await _post(client, s.url, "tools/list", _params())).json()["result"]
        assert len(tools["tools"]) == 5 and tools["ttlMs"] == 0 and tools["resultType"] == "complete"
        call = await _post(client, s.url, "tools/call", _params(name="status", arguments={}), name="status")
        assert call.json()["result"]["resultType"] == "complete"
        assert "ttlMs" not in call.json()["result"]


async def test_envelope_header_and_version_errors() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        r = await client.post(s.url, headers=modern_headers("tools/list"), json=rpc("tools/list", {}))
        assert r.status_code == 400 and r.json()["error"]["code"] == -32602
        r = await client.post(s.url, headers=modern_headers("tools/call"), json=rpc("tools/list", _params()))
        assert r.status_code == 400 and r.json()["error"]["code"] == -32020
        r = await _post(client, s.url, "tools/call", _params(name="status", arguments={}), name="other")
        assert r.status_code == 400 and r.json()["error"]["code"] == -32020
        encoded = "=?base64?" + base64.b64encode(b"status").decode() + "?="
        r = await _post(client, s.url, "tools/call", _params(name="status", arguments={}), name=encoded)
        assert r.status_code == 200
        headers = modern_headers("tools/list")
        headers["mcp-protocol-version"] = "2099-01-01"
        meta = {**modern_meta(), "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
        r = await client.post(s.url, headers=headers, json=rpc("tools/list", {"_meta": meta}))
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["code"] == -32022
        assert err["data"] == {"supported": [MODERN, "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"],
                               "requested": "2099-01-01"}


async def test_legacy_methods_404_get_405_and_notification_202() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        for method in ("ping", "resources/subscribe", "no/such"):
            r = await _post(client, s.url, method, _params(uri="x"))
            assert r.status_code == 404 and r.json()["error"]["code"] == -32601
        r = await client.get(s.url, headers={"accept": "text/event-stream", "mcp-protocol-version": MODERN})
        assert r.status_code == 405
        r = await client.post(s.url, headers=modern_headers("notifications/cancelled"),
                              json=rpc("notifications/cancelled", _params(), None))
        assert r.status_code == 202


async def test_unsupported_version_names_exactly_what_the_endpoint_accepts() -> None:
    """-32022's ``data.supported`` is discover's ``supportedVersions``, and each named version is really served:
    the modern one through discover, every handshake one through ``initialize`` on the legacy wire."""
    async with serving() as s, httpx.AsyncClient() as client:
        discovered = (await _post(client, s.url, "server/discover", _params())).json()["result"]["supportedVersions"]
        headers = {**modern_headers("server/discover"), "mcp-protocol-version": "2099-01-01"}
        meta = {**modern_meta(), "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
        r = await client.post(s.url, headers=headers, json=rpc("server/discover", {"_meta": meta}, 301))
        assert r.status_code == 400 and r.json()["id"] == 301
        assert r.json()["error"]["data"] == {"supported": discovered, "requested": "2099-01-01"}
        for version in discovered:
            if version == MODERN:
                continue
            init = rpc("initialize", {"protocolVersion": version, "capabilities": {},
                                      "clientInfo": {"name": "t", "version": "1"}})
            r = await client.post(s.url, headers=ACCEPT, json=init)
            assert r.status_code == 200 and decode_reply(r)["result"]["protocolVersion"] == version


async def test_initialize_on_the_modern_wire_is_a_removed_method_and_still_served_on_the_legacy_wire() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        for id_, method in enumerate(("initialize", "logging/setLevel", "resources/unsubscribe"), start=500):
            r = await _post(client, s.url, method, _params(), id=id_)
            assert r.status_code == 404, (method, r.text)
            assert r.json()["error"]["code"] == -32601 and r.json()["id"] == id_
        init = rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                  "clientInfo": {"name": "t", "version": "1"}})
        for headers in (ACCEPT, {**ACCEPT, "mcp-protocol-version": "2025-11-25"}):
            r = await client.post(s.url, headers=headers, json=init)
            assert r.status_code == 200 and r.headers["mcp-session-id"]
            assert decode_reply(r)["result"]["protocolVersion"] == "2025-11-25"


async def test_missing_handle_is_32602_on_modern() -> None:
    async with serving() as s, httpx.AsyncClient() as client:
        uri = "agent://subagent/served.9"
        r = await _post(client, s.url, "resources/read", _params(uri=uri), name=uri)
        err = r.json()["error"]
        assert err["code"] == -32602 and err["data"] == {"uri": uri}


async def test_listen_ack_first_updated_with_subscription_id_then_final_on_drain() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        spawn = await _post(client, s.url, "tools/call",
                            _params(name="subagent.spawn", arguments={"instruction": "sleep=0.3", "async": True}),
                            name="subagent.spawn")
        handle = spawn.json()["result"]["structuredContent"]["handle"]
        uri = f"agent://subagent/{handle}"
        params = _params(notifications={"resourceSubscriptions": [uri, "agent://subagent/nope"],
                                        "toolsListChanged": True})
        decoder = SseDecoder()
        with trio.fail_after(5):
            async with client.stream("POST", s.url, headers=modern_headers("subscriptions/listen"),
                                     json=rpc("subscriptions/listen", params, "L1")) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                assert r.headers["x-accel-buffering"] == "no"
                stream = r.aiter_bytes()
                events = await read_events(stream, decoder, 2)
                frames = [json.loads(e.data) for e in events if e.data]
                ack, updated = frames[0], frames[1]
                assert ack["method"] == "notifications/subscriptions/acknowledged"
                assert ack["params"]["notifications"] == {"resourceSubscriptions": [uri]}
                assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L1"
                assert updated["method"] == "notifications/resources/updated"
                assert updated["params"] == {"_meta": {"io.modelcontextprotocol/subscriptionId": "L1"}, "uri": uri}
                s.app.drain()
                rest = []
                async for chunk in stream:
                    rest.extend(decoder.feed(chunk))
                final = [json.loads(e.data) for e in rest if e.data]
                assert final == [{"jsonrpc": "2.0", "id": "L1", "result": {
                    "resultType": "complete", "_meta": {"io.modelcontextprotocol/subscriptionId": "L1"}}}]


async def test_listen_on_already_terminal_handle_updates_right_after_ack() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        await _post(client, s.url, "tools/call", _params(name="subagent.spawn", arguments={"instruction": "x"}),
                    name="subagent.spawn")
        uri = "agent://subagent/served.1"
        with trio.fail_after(5):
            async with client.stream("POST", s.url, headers=modern_headers("subscriptions/listen"),
                                     json=rpc("subscriptions/listen",
                                              _params(notifications={"resourceSubscriptions": [uri]}), 7)) as r:
                events = await read_events(r.aiter_bytes(), SseDecoder(), 2)
        frames = [json.loads(e.data) for e in events if e.data]
        assert frames[0]["method"] == "notifications/subscriptions/acknowledged"
        assert frames[1]["params"]["uri"] == uri
        assert frames[1]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == 7


async def test_closing_a_sync_spawn_stream_cancels_the_run_on_modern_only() -> None:
    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        params = _params(name="subagent.spawn", arguments={"instruction": "sleep=30"})
        with trio.fail_after(5):
            async with client.stream("POST", s.url, headers=modern_headers("tools/call", "subagent.spawn"),
                                     json=rpc("tools/call", params)) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                await until(lambda: s.backend.runs, timeout=5, what="the run started")
            # the response stream is closed: the run is cancelled
            await until(lambda: s.backend.cancelled, timeout=5, what="the run cancelled")
        assert s.backend.cancelled == ["served.1"]
        assert s.backend.runs["served.1"].view.status == "cancelled"


async def test_legacy_disconnect_does_not_cancel() -> None:
    from tests.selfmcp.harness import LegacyPeer

    async with serving() as s, httpx.AsyncClient(timeout=10) as client:
        peer = LegacyPeer(client, s.url)
        await peer.initialize()
        body = rpc("tools/call", {"name": "subagent.spawn", "arguments": {"instruction": "sleep=0.5"}}, 5)
        with trio.fail_after(5):
            async with client.stream("POST", s.url, headers=peer.headers(), json=body) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                await until(lambda: s.backend.runs, timeout=5, what="the run started")
            await s.backend.runs["served.1"].done.wait()
        assert s.backend.cancelled == []
        assert s.backend.runs["served.1"].view.status == "completed"
        assert ACCEPT  # the legacy peer sent both media types
