"""Agents driving agents: real agentd processes on loopback.

A worker agentd serves its self-MCP (HTTPS with mTLS, or HTTPS with a bearer) and runs served subagents
through its real supervisor (re-exec'd children, ``--intelligence test``). A parent agentd declares it as
``--mcp reviewer=https://127.0.0.1:PORT`` (client certificate or bearer header via ``--config``) and drives
it: the offline test model calls every reviewer tool once, ``subagent.spawn`` sync among them, and gets the
distilled result. The subscribe pattern runs agentd's own MCP client (the parent's code) in this process
against the worker: spawn async, subscribe ``agent://subagent/{handle}``, wake on ``updated``, read.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from agentd.config.model import McpServerConfig, TlsConfig
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.selfmcp.certs import Pki, make_pki

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

ROOT = Path(__file__).resolve().parents[2]
AGENTD = [sys.executable, "-m", "agentd"]
TOKEN = "worker-bearer-token-1234"


@asynccontextmanager
async def worker(argv: list[str], env: dict[str, str] | None = None,
                 stderr_lines: list[str] | None = None) -> AsyncIterator[str]:
    """Start ``agentd --serve-mcp ...``; yield its URL once ``serve.start`` is logged; SIGTERM at the end.
    Every stderr line is appended to ``stderr_lines`` if given."""
    proc = await trio.lowlevel.open_process(
        [*AGENTD, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    lines: list[str] = stderr_lines if stderr_lines is not None else []
    try:
        with trio.fail_after(30):
            buffer = b""
            url = None
            while url is None:
                chunk = await proc.stderr.receive_some(65536)
                assert chunk, "worker exited: " + "".join(lines)[-2000:]
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    lines.append(raw.decode())
                    event = json.loads(raw)
                    if event["event"] == "serve.start":
                        url = event["urls"][0]

        async def drain_stderr() -> None:
            rest = buffer
            while chunk := await proc.stderr.receive_some(65536):
                rest += chunk
                *complete, rest = rest.split(b"\n")
                lines.extend(raw.decode() for raw in complete)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain_stderr)
            yield url
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                assert await proc.wait() == 0
            nursery.cancel_scope.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def run_parent(argv: list[str], env: dict[str, str] | None = None) -> dict:
    with trio.fail_after(90):
        done = await trio.run_process([*AGENTD, *argv], capture_stdout=True, capture_stderr=True, cwd=ROOT,
                                      env={**os.environ, **(env or {})}, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _worker_mtls(pki: Pki) -> list[str]:
    return ["--serve-mcp", "https://127.0.0.1:0", "--serve-cert", str(pki.server.cert), "--serve-key",
            str(pki.server.key), "--serve-client-ca", str(pki.ca), "--intelligence", "test"]


def _observed(result: dict) -> dict:
    text = result["result"]
    body = json.loads(text) if isinstance(text, str) else text
    return body["observed"]


async def test_parent_drives_worker_over_mtls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    async with worker(_worker_mtls(pki)) as url:
        config = tmp_path / "parent.yaml"
        config.write_text(
            "mcp_servers:\n"
            f"  - name: reviewer\n    url: {url}\n"
            f"    tls: {{ca: {pki.ca}, cert: {pki.client.cert}, key: {pki.client.key}}}\n"
        )
        result = await run_parent(["--config", str(config), "--instruction", "orchestrate the review",
                                   "--intelligence", "test"])
    observed = _observed(result)
    spawn = observed["reviewer__subagent_spawn"]
    assert spawn["isError"] is False, observed
    assert "served.1" in spawn["text"] and "completed" in spawn["text"]
    assert observed["reviewer__status"]["isError"] is False


async def test_parent_drives_worker_over_bearer_and_wrong_token_fails(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    argv = ["--serve-mcp", "https://127.0.0.1:0", "--serve-cert", str(pki.server.cert), "--serve-key",
            str(pki.server.key), "--serve-bearer", "{{secret:REVIEWER_TOKEN}}", "--intelligence", "test"]
    worker_log: list[str] = []
    async with worker(argv, env={"REVIEWER_TOKEN": TOKEN}, stderr_lines=worker_log) as url:
        config = tmp_path / "parent.yaml"
        config.write_text(
            "mcp_servers:\n"
            f"  - name: reviewer\n    url: {url}\n"
            "    headers: {Authorization: 'Bearer {{secret:REVIEWER_TOKEN}}'}\n"
            f"    tls: {{ca: {pki.ca}}}\n"
        )
        result = await run_parent(["--config", str(config), "--instruction", "review", "--intelligence", "test"],
                                  env={"REVIEWER_TOKEN": TOKEN})
        assert _observed(result)["reviewer__subagent_spawn"]["isError"] is False
        with trio.fail_after(60):
            bad = await trio.run_process(
                [*AGENTD, "--config", str(config), "--instruction", "review", "--intelligence", "test"],
                capture_stdout=True, capture_stderr=True, cwd=ROOT,
                env={**os.environ, "REVIEWER_TOKEN": "wrong-token-xyz"}, check=False)
        assert bad.returncode == 6  # a required server refused the handshake
        assert TOKEN.encode() not in bad.stderr
    assert any('"serve.refused"' in line and '"bearer"' in line for line in worker_log)
    assert worker_log and not any(TOKEN in line for line in worker_log)


@pytest.mark.parametrize(("listen", "path"), [("http://127.0.0.1:0/agent", "/agent"), ("http://127.0.0.1:0", "/mcp")])
async def test_the_advertised_url_answers(listen: str, path: str) -> None:
    """serve.start advertises a URL a client can use as written: with the served path, not a bare origin."""
    import httpx

    async with worker(["--serve-mcp", listen, "--intelligence", "test"]) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith(path), url
        async with httpx.AsyncClient() as client:
            reply = await client.post(url, headers={"Accept": "application/json, text/event-stream"}, json={
                "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"}}})
        assert reply.status_code == 200, reply.text
        assert reply.json()["result"]["serverInfo"]["name"]


async def test_non_loopback_bind_without_auth_exits_2() -> None:
    with trio.fail_after(30):
        done = await trio.run_process([*AGENTD, "--serve-mcp", "http://0.0.0.0:0", "--intelligence", "test"],
                                      capture_stdout=True, capture_stderr=True, cwd=ROOT, check=False)
    assert done.returncode == 2
    assert b"non-loopback" in done.stderr


async def test_subscribe_pattern_with_agentd_client_over_mtls(tmp_path: Path) -> None:
    from agentd.client import open_mcp_pool

    pki = make_pki(tmp_path / "pki")
    async with worker(_worker_mtls(pki)) as url:
        server = McpServerConfig(name="reviewer", url=url,
                                 tls=TlsConfig(ca=str(pki.ca), cert=str(pki.client.cert), key=str(pki.client.key)))
        log = EventLog(sink=lambda line: None)
        with trio.fail_after(60):
            async with open_mcp_pool([server], log=log, secrets=SecretResolver(env={}), run_id="parent") as pool:
                ack = await pool.call_tool("reviewer", "subagent.spawn",
                                           {"instruction": "review asynchronously", "async": True})
                handle = ack.structured["handle"]
                assert ack.structured == {"handle": handle, "status": "running", "done": False}
                uri = f"agent://subagent/{handle}"
                assert await pool.subscribe(uri, server="reviewer") is True
                update = await pool.updates().receive()
                assert (update.server, update.uri) == ("reviewer", uri)
                body = json.loads((await pool.read_resource(uri, server="reviewer")).contents[0]["text"])
                assert body["handle"] == handle and body["done"] is True and body["status"] == "completed"
                assert "agentd-offline-test" in json.dumps(body["result"])
