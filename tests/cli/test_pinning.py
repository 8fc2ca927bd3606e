"""Catalogue hashes and pins through the real CLI: ``agentd check`` prints each tool's hash, and a run whose
config pins a server refuses the tool whose hash differs (not offered to the model, an event names both hashes).
Against the official SDK peer and the scripted gateway."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.cli.helpers import run_agentd
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text, tool_call

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]


def _expected_hash(tool: dict[str, Any]) -> str:
    fields = {k: tool.get(k) for k in ("description", "inputSchema", "outputSchema", "annotations", "title")}
    text_ = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text_.encode()).hexdigest()


def _check_hashes(config: Path) -> dict[str, Any]:
    outcome = run_agentd(["check", "--config", str(config), "--output", "json"], timeout=60)
    assert outcome.code == 0, outcome.stderr
    (server,) = outcome.document["servers"]
    return dict(server)


async def test_check_prints_hashes_and_a_pin_refuses_a_changed_tool(
    sdk_server: launch.PeerProcess, tmp_path: Path,
) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text(f"mcp_servers:\n  - {{name: peer, url: '{sdk_server.url}'}}\n")
    server = _check_hashes(plain)
    hashes = {t["name"]: t["hash"] for t in server["tools"]}
    assert len(hashes) >= 47 and server["refusedTools"] == []
    for tool in server["tools"]:
        assert tool["hash"] == _expected_hash(tool), tool["name"]

    # The reviewed echo differed from what the server lists now: pin the reviewed (other) hash.
    reviewed = "0" * 64
    pins = {**hashes, "echo": reviewed}
    (tmp_path / "peer.pins.json").write_text(json.dumps(pins))
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(f"mcp_servers:\n  - {{name: peer, url: '{sdk_server.url}', pin_file: peer.pins.json}}\n")

    server = _check_hashes(pinned)
    assert server["refusedTools"] == [{"name": "echo", "hash": hashes["echo"], "pinned": reviewed}]
    assert "echo" not in [t["name"] for t in server["tools"]]

    script = [tool_call("peer__echo", {"text": "leak"}), tool_call("peer__add", {"a": 2, "b": 3}), text("done")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "AGENT_"))}
    async with scripted_gateway(script) as gw:
        with trio.fail_after(60):
            done = await trio.run_process(
                [sys.executable, "-m", "agentd", "--instruction", "go", "--intelligence", gw.url,
                 "--config", str(pinned)],
                capture_stdout=True, capture_stderr=True, check=False, cwd=launch.REPO_ROOT, env=env,
                stdin=subprocess.DEVNULL)
        requests = list(gw.requests)
    events = [json.loads(line) for line in done.stderr.decode().splitlines() if line.strip()]
    doc = json.loads(done.stdout)
    assert doc["status"] == "completed" and doc["result"] == "done", done.stderr.decode()[-2000:]
    (mismatch,) = [e for e in events if e["event"] == "mcp.tool_pin_mismatch"]
    assert (mismatch["server"], mismatch["tool"], mismatch["pinned"], mismatch["listed"]) == (
        "peer", "echo", reviewed, hashes["echo"])
    offered = {t["function"]["name"] for t in requests[0].body["tools"]}
    assert "peer__echo" not in offered and "peer__add" in offered
    calls = [(e["server"], e["tool"]) for e in events if e["event"] == "tool.call" and e.get("server")]
    assert calls == [("peer", "add")]  # echo never reached the server
    (catalogue,) = [e for e in events if e["event"] == "mcp.catalogue" and "server" in e]  # the client's listing
    listed = {t["name"]: t for t in catalogue["tools"]}
    assert listed["echo"]["refused"] is True and listed["echo"]["hash"] == hashes["echo"]
