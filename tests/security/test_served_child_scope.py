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

from agentd.config.load import load_config
from agentd.config.model import McpServerConfig
from agentd.telemetry.events import EventLog
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



def _memory_holds(pid: int, needles: list[bytes]) -> set[bytes]:
    """Which of ``needles`` appear anywhere in ``pid``'s readable memory (read as root through /proc/PID/mem)."""
    found: set[bytes] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            found |= {needle for needle in needles if needle in chunk}
    return found


PEER_SECRETS = {"FS_TOKEN": "fs-token-in-scope-31415926", "PEER_TOKEN": "a2a-peer-token-27182818"}


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
async def test_a_childs_memory_holds_the_credentials_of_its_scope_and_no_a2a_peer_outside_it(tmp_path: Path) -> None:
    """Scoped to the MCP server, a child's memory holds that server's token and not the A2A peer's; scoped to
    the peer, the reverse. Memory is read from /proc, so this also proves nothing else carried the value in."""
    import os

    from agentd.client import open_mcp_pool

    if os.geteuid() != 0:
        pytest.skip("reading another process's memory needs root")
    config = tmp_path / "worker.yaml"
    config.write_text(json.dumps({
        "mcp_servers": [{"name": "fs", "url": "http://127.0.0.1:9/mcp", "required": False, "connect_timeout": "2s",
                         "headers": {"Authorization": "Bearer {{secret:FS_TOKEN}}"}}],
        "a2a_peers": [{"name": "helper", "url": "http://127.0.0.1:9/a2a", "required": False,
                       "connect_timeout": "2s", "headers": {"Authorization": "Bearer {{secret:PEER_TOKEN}}"}}],
    }))
    argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", "test", "--config", str(config)]
    needles = [value.encode() for value in PEER_SECRETS.values()]
    held: dict[str, set[bytes]] = {}
    lines: list[str] = []
    with trio.fail_after(120):
        async with worker(argv, env=PEER_SECRETS, stderr_lines=lines) as url:
            daemon_pid = next(json.loads(line)["pid"] for line in lines if '"serve.start"' in line)
            async with open_mcp_pool([McpServerConfig("w", url)], log=EventLog(sink=lambda _: None)) as pool:
                for scope in ("fs", "helper"):
                    before = set(proctree.descendants(daemon_pid))
                    spawned = await pool.call_tool("w", "subagent.spawn", {
                        "instruction": "say hello", "warm": True, "tool_scope": [scope]})
                    assert not spawned.is_error, spawned.content
                    new = [pid for pid in proctree.descendants(daemon_pid) if pid not in before]
                    # The first spawn also starts the fork server (the new child's parent): not the child.
                    parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in new}
                    [child] = [pid for pid in new if pid not in parents]
                    held[scope] = _memory_holds(child, needles)
    fs, peer = (value.encode() for value in PEER_SECRETS.values())
    assert held["fs"] == {fs}, "scoped to the MCP server: its token and not the A2A peer's"
    assert held["helper"] == {peer}, "scoped to the A2A peer: its token and not the MCP server's"


def test_a_child_inherits_no_cluster_membership_nor_its_password_reference() -> None:
    """A DSN may carry ``{{secret:NAME}}`` in its password position: the child's config (and so the secrets
    it receives) must hold neither, nor the operator socket."""
    from agentd.supervisor.supervisor import referenced_secrets
    from agentd.supervisor.wiring import config_to_wire

    env = {"PG_PASSWORD": "pg-password-canary-161803", "FS_TOKEN": "fs-token-canary"}
    cfg = load_config(["--intelligence", "test", "--serve-mcp", "http://127.0.0.1:0/mcp",
                            "--cluster", "postgresql://agentd:{{secret:PG_PASSWORD}}@127.0.0.1:5432/agentd",
                            "--ctl-socket", "/tmp/agentd-ctl.sock"], env=env)
    assert cfg.cluster.dsn is not None and cfg.ctl_socket is not None
    wire = config_to_wire(cfg)
    assert wire["cluster"] is None and wire["ctl_socket"] is None
    assert referenced_secrets(wire, env) == {}
