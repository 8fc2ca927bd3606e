"""The official MCP Python SDK client (mcp 2.x) driving agentd's server, in legacy and in modern mode."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import trio

from tests.selfmcp.harness import serving

pytestmark = pytest.mark.interop

mcp = pytest.importorskip("mcp")


def _client(url: str, mode: str, **kw: Any) -> Any:
    from mcp.client.client import Client

    return Client(url, mode=mode, **kw)


async def test_sdk_legacy_drives_and_subscribes() -> None:
    updates: list[str] = []
    got = trio.Event()

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        params = getattr(root, "params", None)
        uri = getattr(params, "uri", None)
        if uri is not None and "resources/updated" in str(getattr(root, "method", "")):
            updates.append(str(uri))
            got.set()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        async with serving() as s:
            with trio.fail_after(20):
                async with _client(s.url, "legacy", message_handler=on_message) as client:
                    assert client.protocol_version == "2025-11-25"
                    assert client.server_info.name == "agentd"
                    tools = await client.list_tools()
                    assert [t.name for t in tools.tools][:2] == ["status", "subagent.spawn"]
                    status = await client.call_tool("status", {})
                    assert status.structured_content["run_id"] == "run-test"
                    sync = await client.call_tool("subagent.spawn", {"instruction": "sync sleep=0.1"})
                    assert sync.structured_content["status"] == "completed"
                    ack = await client.call_tool("subagent.spawn", {"instruction": "sleep=0.5", "async": True})
                    uri = f"agent://subagent/{ack.structured_content['handle']}"
                    await client.subscribe_resource(uri)
                    await got.wait()
                    assert updates == [uri]
                    read = await client.read_resource(uri)
                    assert json.loads(read.contents[0].text)["done"] is True


async def test_sdk_auto_mode_goes_modern_and_listens() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        async with serving() as s:
            with trio.fail_after(20):
                async with _client(s.url, "auto") as client:
                    assert client.protocol_version == "2026-07-28"
                    tools = await client.list_tools()
                    assert len(tools.tools) == 5
                    ack = await client.call_tool("subagent.spawn", {"instruction": "sleep=0.4", "async": True})
                    uri = f"agent://subagent/{ack.structured_content['handle']}"
                    async with client.listen(resource_subscriptions=[uri]) as sub:
                        async for event in sub:
                            assert str(getattr(event, "uri", "")) == uri
                            break
                    read = await client.read_resource(uri)
                    assert json.loads(read.contents[0].text)["status"] == "completed"
                    sync = await client.call_tool("subagent.spawn", {"instruction": "sleep=0.1"})
                    assert sync.structured_content["done"] is True


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
async def test_sdk_drives_a_warm_session_on_a_real_worker_and_reads_each_turn() -> None:
    """A served warm session answers: the spawn's ack carries the first turn's result, and after each
    ``subagent.send`` (a sync ack) the subscribed peer gets ``updated`` when the turn ends, then reads that
    turn's result and counter from ``subagent.status`` and the handle's resource, the session still open."""
    from tests.integration.agents import agentd_worker, text_of
    from tests.peers.gateway import RecordedRequest, scripted_gateway, text

    def reply(request: RecordedRequest) -> dict[str, Any]:
        users = [text_of(m.get("content")) for m in request.messages if m.get("role") == "user"]
        return text(f"ANSWER-TO {users[-1].split()[-1]}")

    updates: list[str] = []
    changed = trio.Event()

    async def on_message(message: Any) -> None:
        nonlocal changed
        root = getattr(message, "root", message)
        uri = getattr(getattr(root, "params", None), "uri", None)
        if uri is not None and "resources/updated" in str(getattr(root, "method", "")):
            updates.append(str(uri))
            changed.set()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        async with scripted_gateway(default=reply) as gw:
            argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url, "--drain-timeout", "5"]
            async with agentd_worker(argv) as worker:
                with trio.fail_after(60):
                    async with _client(f"http://127.0.0.1:{worker.port}/mcp", "legacy",
                                       message_handler=on_message) as client:
                        ack = (await client.call_tool("subagent.spawn",
                                                      {"instruction": "open alpha", "warm": True})).structured_content
                        handle = ack["handle"]
                        uri = f"agent://subagent/{handle}"
                        assert ack["status"] == "awaiting_turn" and ack["done"] is False, ack
                        assert ack["turns"] == 1 and "ANSWER-TO alpha" in json.dumps(ack["result"]), ack
                        await client.subscribe_resource(uri)
                        for n, word in ((2, "beta"), (3, "gamma")):
                            changed = trio.Event()
                            sent = await client.call_tool("subagent.send", {"handle": handle, "message": word})
                            assert sent.structured_content == {"handle": handle, "accepted": True}
                            await changed.wait()  # the turn's end, pushed to the subscribed peer
                            body = json.loads((await client.read_resource(uri)).contents[0].text)
                            assert body["status"] == "awaiting_turn" and body["done"] is False, body
                            assert body["turns"] == n and f"ANSWER-TO {word}" in json.dumps(body["result"]), body
                            status = (await client.call_tool("subagent.status", {"handle": handle})).structured_content
                            assert status["turns"] == n and status["result"] == body["result"]
                        assert updates == [uri, uri]  # one per turn; the subscription is kept across turns
                        final = (await client.call_tool("subagent.cancel", {"handle": handle})).structured_content
                        assert final["done"] is True and final["turns"] == 3
    turn_updates = [e for e in worker.events if e.get("event") == "serve.updated" and "turn" in e]
    assert [e["turn"] for e in turn_updates] == [2, 3]


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
async def test_a_sync_spawn_hands_back_the_childs_json_as_a_value() -> None:
    """A served sync spawn whose child answered with a JSON object returns that object as ``result`` (in
    ``structuredContent`` and in the text), not a string holding JSON; prose stays a string."""
    from tests.integration.agents import agentd_worker, text_of
    from tests.peers.gateway import RecordedRequest, scripted_gateway, text

    def reply(request: RecordedRequest) -> dict[str, Any]:
        users = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
        if "as json" in users:
            return text('{"verdict": "approve", "issues": [1, 2]}')
        return text("just prose")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        async with scripted_gateway(default=reply) as gw:
            argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url, "--drain-timeout", "5"]
            async with agentd_worker(argv) as worker:
                with trio.fail_after(60):
                    async with _client(f"http://127.0.0.1:{worker.port}/mcp", "legacy") as client:
                        structured = await client.call_tool("subagent.spawn", {"instruction": "review as json"})
                        prose = await client.call_tool("subagent.spawn", {"instruction": "review"})
    assert structured.structured_content["result"] == {"verdict": "approve", "issues": [1, 2]}
    assert json.loads(structured.content[0].text)["result"] == {"verdict": "approve", "issues": [1, 2]}
    assert prose.structured_content["result"] == "just prose"
