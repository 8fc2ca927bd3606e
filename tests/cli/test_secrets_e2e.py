"""Secrets end to end through the real CLI: resolved at connect time, sent on the wire, never echoed.

A recording HTTP server stands in for both an MCP server and a gateway: it keeps every request head and
answers with an error status, so the run fails (exit 6 or 4) after the credential has been sent.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import trio

from tests.cli.helpers import clean_env

MCP_SECRET = "mcp-Tok3n-Qv8Zr2Lx9Wd4"
GW_SECRET = "gw-Tok3n-Hs5Kp7Jm1Nc6"


class Recorder:
    def __init__(self, status: bytes) -> None:
        self.status = status
        self.heads: list[str] = []

    async def handle(self, stream: trio.SocketStream) -> None:
        data = b""
        with trio.move_on_after(10):
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                data += chunk
        self.heads.append(data.split(b"\r\n\r\n", 1)[0].decode("latin-1"))
        await stream.send_all(b"HTTP/1.1 " + self.status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await stream.aclose()


async def run_cli(args: list[str], env: dict[str, str]) -> trio.CompletedProcess[bytes]:
    with trio.fail_after(60):
        return await trio.run_process([sys.executable, "-m", "agentd", *args], env=clean_env(env),
                                      capture_stdout=True, capture_stderr=True, check=False,
                                      stdin=b"")


def authorization(heads: list[str]) -> list[str]:
    return [line.split(":", 1)[1].strip() for head in heads for line in head.split("\r\n")
            if line.lower().startswith("authorization:")]


async def test_mcp_header_secret_is_sent_and_never_echoed(tmp_path: Path) -> None:
    recorder = Recorder(b"500 Internal Server Error")
    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(functools.partial(trio.serve_tcp, recorder.handle, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        config = tmp_path / "agentd.yaml"
        config.write_text(f"mcp_servers:\n  - name: rec\n    url: http://127.0.0.1:{port}/mcp\n"
                          "    headers: {Authorization: 'Bearer {{secret:REC_TOKEN}}'}\n    connect_timeout: 5s\n")
        done = await run_cli(["--instruction", "x", "--intelligence", "test", "--config", str(config),
                              "--log-level", "debug", "--log-content"], {"REC_TOKEN": MCP_SECRET})
        nursery.cancel_scope.cancel()
    assert done.returncode == 6, done.stderr.decode()
    assert f"Bearer {MCP_SECRET}" in authorization(recorder.heads)
    out = done.stdout.decode() + done.stderr.decode()
    assert MCP_SECRET not in out
    assert json.loads(done.stdout)["status"] == "mcp_failed"


async def test_gateway_token_is_sent_and_never_echoed(tmp_path: Path) -> None:
    recorder = Recorder(b"401 Unauthorized")
    token_file = tmp_path / "gw-token"
    token_file.write_text(GW_SECRET + "\n")
    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(functools.partial(trio.serve_tcp, recorder.handle, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        done = await run_cli(["--instruction", "x", "--intelligence", f"http://127.0.0.1:{port}/v1",
                              "--intelligence-token-file", str(token_file), "--log-level", "debug",
                              "--log-content"], {})
        nursery.cancel_scope.cancel()
    assert done.returncode == 4, done.stderr.decode()
    assert f"Bearer {GW_SECRET}" in authorization(recorder.heads)
    assert GW_SECRET not in done.stdout.decode() + done.stderr.decode()


async def test_literal_environment_token_is_used_by_reference(tmp_path: Path) -> None:
    recorder = Recorder(b"401 Unauthorized")
    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(functools.partial(trio.serve_tcp, recorder.handle, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        done = await run_cli(["--instruction", "x", "--intelligence", f"http://127.0.0.1:{port}/v1",
                              "--log-level", "debug", "--log-content"], {"AGENTD_INTELLIGENCE_TOKEN": GW_SECRET})
        nursery.cancel_scope.cancel()
    assert done.returncode == 4, done.stderr.decode()
    assert f"Bearer {GW_SECRET}" in authorization(recorder.heads)
    assert GW_SECRET not in done.stdout.decode() + done.stderr.decode()
