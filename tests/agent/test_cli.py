"""Every exit code through the real CLI: ``python -m agentd`` in a subprocess, stdout one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from tests.agent import meta_server
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text, tool_call

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]

CONTRACT_KEYS = ["run_id", "status", "done", "partial", "result", "steps", "usage"]


@pytest.fixture(scope="module")
def peer() -> Iterator[launch.PeerProcess]:
    with launch.start_peer(meta_server.argv(), cwd=launch.REPO_ROOT) as started:
        yield started


async def _agentd(*args: str) -> tuple[int, Any, list[dict[str, Any]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "AGENT_"))}
    with trio.fail_after(60):
        done = await trio.run_process([sys.executable, "-m", "agentd", *args], capture_stdout=True,
                                      capture_stderr=True, check=False, cwd=launch.REPO_ROOT, env=env,
                                      stdin=subprocess.DEVNULL)
    out = done.stdout.decode().splitlines()
    events = [json.loads(line) for line in done.stderr.decode().splitlines() if line.strip()]
    doc = json.loads(out[0]) if out else None
    assert len(out) <= 1, out
    return done.returncode, doc, events


@pytest.mark.parametrize(
    ("reply", "extra", "code", "status"),
    [
        (text("all good"), [], 0, "completed"),
        (text("y" * 9000), [], 3, "completed"),
        (tool_call("sdk__echo", {"text": "again"}), ["--max-steps", "2"], 7, "exhausted_steps"),
        (tool_call("sdk__bad_structured", {}), [], 1, "failed"),  # three tool faults in a row
    ],
)
async def test_exit_codes_with_a_gateway(peer: launch.PeerProcess, reply: dict[str, Any], extra: list[str],
                                         code: int, status: str) -> None:
    async with scripted_gateway(default=reply) as gw:
        rc, doc, events = await _agentd("--instruction", "go", "--intelligence", gw.url, "--mcp", f"sdk={peer.url}",
                                        "--run-id", "cli-run", *extra)
    assert rc == code
    assert list(doc) == CONTRACT_KEYS
    assert (doc["run_id"], doc["status"], doc["done"]) == ("cli-run", status, True)
    assert doc["partial"] is (code != 0)
    for event in events:
        assert {"ts", "level", "event", "run_id", "agent_path", "comp", "pid"} <= set(event)
    assert any(e["event"] == "run.end" and e["exit_code"] == code for e in events)


async def test_exit_4_intelligence_down(peer: launch.PeerProcess) -> None:
    rc, doc, _ = await _agentd("--instruction", "go", "--intelligence", "http://127.0.0.1:9/v1",
                               "--mcp", f"sdk={peer.url}")
    assert (rc, doc["status"]) == (4, "intelligence_failed")


async def test_exit_6_required_server_down() -> None:
    rc, doc, _ = await _agentd("--instruction", "go", "--intelligence", "test", "--mcp", "gone=http://127.0.0.1:9/mcp")
    assert (rc, doc["status"]) == (6, "mcp_failed")


async def test_exit_2_bad_usage_before_side_effects() -> None:
    rc, doc, events = await _agentd("--instruction", "go", "--intelligence", "test", "--max-steps", "zero")
    assert rc == 2 and doc is None
    assert not any(e["event"] == "run.start" for e in events)


async def test_offline_model_end_to_end(peer: launch.PeerProcess) -> None:
    rc, doc, events = await _agentd("--instruction", "exercise the tools", "--intelligence", "test",
                                    "--mcp", f"sdk={peer.url}")
    assert rc == 0 and doc["status"] == "completed"
    assert doc["steps"] == sum(e["event"] == "tool.call" for e in events) + 1


async def test_sigterm_drains_at_a_step_boundary_exit_0(peer: launch.PeerProcess) -> None:
    import signal

    script = [tool_call("sdk__slow", {"seconds": 2}, content="working on it"), text("never reached")]
    async with scripted_gateway(script) as gw:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "AGENT_"))}
        argv = [sys.executable, "-m", "agentd", "--instruction", "go", "--intelligence", gw.url,
                "--mcp", f"sdk={peer.url}"]
        with trio.fail_after(60):
            proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                    stdin=subprocess.DEVNULL, cwd=launch.REPO_ROOT, env=env)
            assert proc.stdout is not None and proc.stderr is not None
            buffer = b""
            while b'"tool.call"' not in buffer:
                chunk = await proc.stderr.receive_some()
                assert chunk, buffer.decode()
                buffer += chunk
            proc.send_signal(signal.SIGTERM)
            out = b""
            async with trio.open_nursery() as nursery:
                async def drain_stderr() -> None:
                    while await proc.stderr.receive_some():
                        pass
                nursery.start_soon(drain_stderr)
                while chunk := await proc.stdout.receive_some():
                    out += chunk
            code = await proc.wait()
    doc = json.loads(out)
    assert code == 0
    assert (doc["status"], doc["partial"], doc["result"], doc["steps"]) == ("cancelled", True, "working on it", 1)
    assert len(gw.requests) == 1
