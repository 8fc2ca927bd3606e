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
