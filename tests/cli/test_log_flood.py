"""A flood a peer can cause cannot flood the log: lines are capped in size and rate-limited per event, and
what is dropped is counted in ``log.suppressed`` lines (nothing silently lost). Real processes, real
sockets, real gateway and MCP server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import trio

from agentd.telemetry.events import MAX_FIELD_CHARS, RATE_LIMIT
from tests.cli.helpers import clean_env
from tests.connections.helpers import connection, run
from tests.connections.peer import mcp_peer
from tests.peers.gateway import scripted_gateway, text, tool_call

TOKEN = "serve-Tok3n-Mz4Ks8Pq1Wx6"


async def test_a_huge_rejected_argument_is_logged_cut(tmp_path: Any) -> None:
    huge = "x" * 1_000_000  # a list where the schema wants a string: rejected, and the reason quotes it
    async with mcp_peer() as peer, scripted_gateway([tool_call("d__search", {"q": [huge]}), text("ok")]) as gw:
        host = {"intelligence": {"url": gw.url, "model": "m"},
                "connections": {"docs": connection(f"{peer.origin}/mcp", tools=["search"], readTools=["search"])},
                "transcript": {"enabled": False}}
        manifest = {"connections": [{"ref": "docs", "alias": "d"}],
                    "steps": [{"id": "s", "prompt": "p", "tools": ["d__search"]}]}
        with trio.fail_after(60):
            outcome = await run(tmp_path, host, manifest)
    assert outcome.code == 0
    [rejected] = outcome.named("tool.rejected")
    # The schema check quotes at most a few hundred characters of the value (agentd.mcp.schemas), so the
    # reason is short at its source, well under the log's own field cut.
    assert len(rejected["reason"]) < 1000 and "…" in rejected["reason"], rejected["reason"][:2000]
    assert peer.calls == []
    for line in outcome.raw.splitlines():
        assert len(line) < 4 * MAX_FIELD_CHARS


async def test_a_bad_bearer_flood_is_rate_limited_and_counted(tmp_path: Any) -> None:
    argv = [sys.executable, "-m", "agentd", "--intelligence", "test", "--run-id", "flood-1",
            "--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-bearer", "{{secret:SERVE_TOKEN}}", "--drain-timeout", "2"]
    flood = 1000
    stderr = bytearray()
    proc = await trio.lowlevel.open_process(argv, env=clean_env({"SERVE_TOKEN": TOKEN}), stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        elapsed = await _flood(proc, stderr, flood)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = [json.loads(line) for line in bytes(stderr).decode().splitlines()]
    refused = [e for e in lines if e["event"] == "serve.refused" and e["reason"] == "bearer"]
    summaries = [e for e in lines if e["event"] == "log.suppressed" and e["suppressed_event"] == "serve.refused"]
    # At most RATE_LIMIT lines per second made it out ...
    assert len(refused) <= RATE_LIMIT * (int(elapsed) + 2), (len(refused), elapsed)
    assert len(refused) < flood
    # ... and every refusal is accounted for: written, or counted in a summary.
    assert len(refused) + sum(e["suppressed"] for e in summaries) == flood
    assert all(e["level"] == "warn" for e in summaries)
    assert TOKEN not in bytes(stderr).decode()


async def _flood(proc: trio.Process, stderr: bytearray, flood: int) -> float:
    """Wait for serve.start, send ``flood`` requests with a wrong bearer (returns how long that took), then
    SIGTERM and read stderr to EOF."""
    async with trio.open_nursery() as nursery:
        assert proc.stderr is not None
        url = ""
        with trio.fail_after(60):
            while not url:
                chunk = await proc.stderr.receive_some(65536)
                assert chunk, bytes(stderr).decode()
                stderr += chunk
                for line in bytes(stderr).decode().splitlines():
                    if line.startswith("{") and line.endswith("}") and json.loads(line)["event"] == "serve.start":
                        url = json.loads(line)["urls"][0]

        async def pump() -> None:
            while chunk := await proc.stderr.receive_some(65536):  # type: ignore[union-attr]
                stderr.extend(chunk)

        nursery.start_soon(pump)
        started = trio.current_time()
        host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)

        async def attacker(n: int) -> None:
            # Pipelined on one connection: the flood is as fast as the server can refuse, even on a busy machine.
            request = (f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer wrong\r\n"
                       "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}").encode()
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                await stream.send_all(request * n)
                seen = b""
                while seen.count(b"HTTP/1.1 401") < n:
                    chunk = await stream.receive_some(65536)
                    assert chunk, seen[-500:]
                    seen += chunk

        with trio.fail_after(120):
            async with trio.open_nursery() as attackers:
                for _ in range(10):
                    attackers.start_soon(attacker, flood // 10)
        elapsed = trio.current_time() - started
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(60):
            await proc.wait()
    return elapsed
