"""A served child holds only the secrets of its own tool scope: none in its environment or argv, and its
payload names exactly the secrets its scope's headers reference.

A real ``agentd --serve-mcp`` worker whose config declares two (optional, unreachable) servers with header
secrets; a peer spawns a warm child scoped to one of them; the worker's descendant processes are read from
``/proc`` while the child waits for its next turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from agentd.config.model import McpServerConfig
from agentd.events import EventLog
from tests.peers import proctree
from tests.selfmcp.test_composition import worker

SECRETS = {"FS_TOKEN": "fs-token-served-scope-0123456", "WEB_TOKEN": "web-token-out-of-scope-987654"}


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
async def test_a_served_child_holds_no_secret_outside_its_scope(tmp_path: Path) -> None:
    from agentd.client import open_mcp_pool

    config = tmp_path / "worker.yaml"
    config.write_text(json.dumps({"mcp_servers": [
        {"name": "fs", "url": "http://127.0.0.1:9/mcp", "required": False, "connect_timeout": "2s",
         "headers": {"Authorization": "Bearer {{secret:FS_TOKEN}}"}},
        {"name": "web", "url": "http://127.0.0.1:9/mcp", "required": False, "connect_timeout": "2s",
         "headers": {"X-Key": "{{secret:WEB_TOKEN}}"}},
    ]}))
    argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", "test", "--config", str(config)]
    lines: list[str] = []
    with trio.fail_after(90):
        async with worker(argv, env=SECRETS, stderr_lines=lines) as url:
            daemon_pid = next(json.loads(line)["pid"] for line in lines if '"serve.start"' in line)
            async with open_mcp_pool([McpServerConfig("w", url)], log=EventLog(sink=lambda _: None)) as pool:
                spawned = await pool.call_tool("w", "subagent.spawn", {
                    "instruction": "say hello", "warm": True, "tool_scope": ["fs"]})
                assert not spawned.is_error, spawned.content
                children = [pid for pid in proctree.descendants(daemon_pid)]
                assert children, "the warm child is alive while it waits for its next turn"
                blobs = []
                for pid in children:
                    for name in ("environ", "cmdline"):
                        try:
                            blobs.append((pid, name, (Path(f"/proc/{pid}") / name).read_bytes()))
                        except (FileNotFoundError, ProcessLookupError):
                            pass
    assert blobs
    for value in SECRETS.values():
        leaked = [(pid, name) for pid, name, blob in blobs if value.encode() in blob]
        assert leaked == [], f"a secret value is in {leaked}"
    for pid, name, blob in blobs:
        if name == "environ":
            names = {kv.split(b"=", 1)[0] for kv in blob.split(b"\0") if b"=" in kv}
            assert not {b"FS_TOKEN", b"WEB_TOKEN"} & names, pid
    assert not any(value in "\n".join(lines) for value in SECRETS.values())

