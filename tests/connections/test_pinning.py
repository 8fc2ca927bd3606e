"""Host ``connections:`` entries are pinned like ``mcp_servers``: ``pin:`` or ``pin_file:`` (relative to the host
file) refuse a tool whose listed hash differs, for ``agentd run MANIFEST`` and plain ``agentd --config``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.config.load import load_config
from agentd.errors import ConfigError
from agentd.mcp.tool_hash import tool_hash
from tests.connections.helpers import connection, run
from tests.connections.peer import TOOLS, mcp_peer
from tests.peers.gateway import scripted_gateway, text, tool_call


def _hash(name: str) -> str:
    (tool,) = [t for t in TOOLS if t["name"] == name]
    return tool_hash(tool.get("description"), tool.get("inputSchema"), tool.get("outputSchema"),
                     tool.get("annotations"), tool.get("title"))


def _host(gw_url: str, url: str, **pinning: Any) -> dict[str, Any]:
    return {
        "intelligence": {"url": gw_url, "model": "m"},
        "connections": {"docs": connection(url, mode="read_write", tools=["search", "read"],
                                           readTools=["search", "read"], **pinning)},
        "transcript": {"enabled": False},
    }


_MANIFEST = {"connections": [{"ref": "docs", "mode": "read_write"}],
             "steps": [{"id": "s", "prompt": "p", "tools": ["docs__search", "docs__read"]}]}


@pytest.mark.parametrize("form", ["pin", "pin_file"])
async def test_a_pinned_connection_refuses_the_changed_tool(tmp_path: Path, form: str) -> None:
    pins = {"search": _hash("search"), "read": "0" * 64}  # read was reviewed with another text
    if form == "pin":
        pinning: dict[str, Any] = {"pin": pins}
    else:
        (tmp_path / "docs.pins.json").write_text(json.dumps(pins))
        pinning = {"pin_file": "docs.pins.json"}  # relative to the host file
    script = [tool_call("docs__read", {"id": "1"}), tool_call("docs__search", {"q": "x"}), text("done")]
    async with mcp_peer() as peer, scripted_gateway(script) as gw:
        with trio.fail_after(30):
            outcome = await run(tmp_path, _host(gw.url, f"{peer.origin}/mcp", **pinning), _MANIFEST)
    assert outcome.code == 0, outcome.raw
    assert gw.requests[0].tool_names == ["docs__search"]  # the changed tool is not offered
    assert peer.calls == [{"name": "search", "arguments": {"q": "x"}}]  # and never reached the server
    (mismatch,) = outcome.named("mcp.tool_pin_mismatch")
    assert (mismatch["tool"], mismatch["pinned"], mismatch["listed"]) == ("read", "0" * 64, _hash("read"))


async def test_matching_pins_refuse_nothing(tmp_path: Path) -> None:
    pins = {"search": _hash("search"), "read": _hash("read")}
    async with mcp_peer() as peer, scripted_gateway([text("done")]) as gw:
        with trio.fail_after(30):
            outcome = await run(tmp_path, _host(gw.url, f"{peer.origin}/mcp", pin=pins), _MANIFEST)
    assert outcome.code == 0, outcome.raw
    assert sorted(gw.requests[0].tool_names) == ["docs__read", "docs__search"]
    assert outcome.named("mcp.tool_pin_mismatch") == []


def test_plain_agentd_reads_connection_pins_and_checks_them(tmp_path: Path) -> None:
    host = tmp_path / "host.yaml"
    (tmp_path / "p.json").write_text(json.dumps({"search": _hash("search")}))
    host.write_text("connections:\n  docs: {url: http://127.0.0.1:9/mcp, tools: [search], pin_file: p.json}\n")
    argv = ["--config", str(host), "--instruction", "x", "--intelligence", "test"]
    assert dict(load_config(argv, {}).server("docs").pin or {}) == {"search": _hash("search")}
    host.write_text("connections:\n  docs: {url: http://127.0.0.1:9/mcp, tools: [search], pin: {search: nope}}\n")
    with pytest.raises(ConfigError, match=r"connections\.docs\.pin: 'search' must map to a tool hash"):
        load_config(argv, {})
    host.write_text("connections:\n  docs: {url: http://127.0.0.1:9/mcp, tools: [search], pin: {}, "
                    "pin_file: p.json}\n")
    with pytest.raises(ConfigError, match="give 'pin' or 'pin_file', not both"):
        load_config(argv, {})
