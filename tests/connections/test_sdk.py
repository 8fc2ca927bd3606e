"""Host config + manifest against the official MCP Python SDK server (a real peer), and ``--mcp`` flags."""

from __future__ import annotations

import pytest
import trio

from tests.connections.helpers import connection, run
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text, tool_call

pytestmark = pytest.mark.interop


async def test_sdk_server_narrowed_to_read_tools(tmp_path):
    async with (
        launch.peer_server(launch.sdk_server_argv()) as peer,
        scripted_gateway([tool_call("fs__echo", {"text": "hi there"}), text("echoed")]) as gw,
    ):
        host = {
            "intelligence": {"url": gw.url},
            "connections": {
                "sdk": connection(
                    peer.url, mode="read_write", tools=["echo", "add", "fail"], readTools=["echo"]
                )
            },
            "transcript": {"enabled": False},
        }
        manifest = {
            "connections": [{"ref": "sdk", "alias": "fs", "mode": "read"}],
            "steps": [{"id": "s", "prompt": "echo", "tools": ["fs__echo"]}],
        }
        with trio.fail_after(30):
            outcome = await run(tmp_path, host, manifest)
    assert outcome.code == 0, outcome.raw
    assert gw.requests[0].tool_names == ["fs__echo"]  # add/fail are allowlisted but not read-only
    assert not outcome.named("config.warning")
    tool_messages = [m["content"] for m in gw.requests[1].messages if m["role"] == "tool"]
    assert "hi there" in tool_messages[0]


async def test_mcp_flag_connection_offers_named_tools(tmp_path):
    async with (
        launch.peer_server(launch.sdk_server_argv()) as peer,
        scripted_gateway([tool_call("x__add", {"a": 2, "b": 3}), text("5")]) as gw,
    ):
        manifest = {
            "connections": [{"ref": "x"}],
            "steps": [{"id": "s", "prompt": "add", "tools": ["x__add"]}],
        }
        host = {"intelligence": {"url": gw.url}, "transcript": {"enabled": False}}
        with trio.fail_after(30):
            outcome = await run(tmp_path, host, manifest, args=["--mcp", f"x={peer.url}"])
    assert outcome.code == 0, outcome.raw
    assert gw.requests[0].tool_names == ["x__add"]
    assert "5" in next(m["content"] for m in gw.requests[1].messages if m["role"] == "tool")
