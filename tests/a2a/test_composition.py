"""A parent agentd delegates over A2A to a worker agentd, over HTTPS with a bearer; the worker runs a real MCP tool.

Both are real processes. One scripted gateway plays both models, told apart by the tools offered: the parent
calls ``a2a.delegate``, the worker's served run calls the SDK peer's ``add`` and reports the observation,
and the parent ends with the delegation's observation. A wrong bearer makes the required peer exit 6.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio

from tests.peers import launch
from tests.peers.gateway import scripted_gateway, tool_call
from tests.selfmcp.certs import make_pki
from tests.selfmcp.test_composition import ROOT, worker

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

TOKEN = "a2a-worker-token-2468"
RULES = [
    ({"tool_offered": "a2a_delegate", "last_role": "user"},
     tool_call("a2a_delegate", {"peer": "worker", "message": "add 2 and 40 with your tool"})),
    ({"tool_offered": "a2a_delegate", "last_role": "tool"}, {"echo_last": True}),
    ({"tool_offered": "sdk__add", "last_role": "user"}, tool_call("sdk__add", {"a": 2, "b": 40})),
    ({"tool_offered": "sdk__add", "last_role": "tool"}, {"echo_last": True}),
]


async def _parent(config: Path, gateway: str, token: str) -> tuple[int, dict, str]:
    argv = [sys.executable, "-m", "agentd", "--instruction", "get the sum from the worker", "--intelligence", gateway,
            "--config", str(config)]
    with trio.fail_after(90):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, cwd=ROOT, check=False,
                                      env={**os.environ, "WORKER_TOKEN": token})
    return done.returncode, json.loads(done.stdout.decode().strip().splitlines()[-1]), done.stderr.decode()


async def test_parent_delegates_to_worker_over_https_bearer(tmp_path: Path, sdk_server: launch.PeerProcess) -> None:
    pki = make_pki(tmp_path / "pki")
    lines: list[str] = []
    async with scripted_gateway(rules=RULES) as gw:
        argv = ["--serve-mcp", "https://127.0.0.1:0", "--serve-cert", str(pki.server.cert), "--serve-key",
                str(pki.server.key), "--serve-bearer", "{{secret:WORKER_TOKEN}}", "--serve-a2a",
                "--intelligence", gw.url, "--mcp", f"sdk={sdk_server.url}"]
        async with worker(argv, env={"WORKER_TOKEN": TOKEN}, stderr_lines=lines) as url:
            config = tmp_path / "parent.yaml"
            config.write_text(
                "a2a_peers:\n"
                f"  - name: worker\n    url: {url}\n"
                "    headers: {Authorization: 'Bearer {{secret:WORKER_TOKEN}}'}\n"
                f"    tls: {{ca: {pki.ca}}}\n"
            )
            code, result, stderr = await _parent(config, gw.url, TOKEN)
            assert code == 0, stderr[-3000:]
            assert result["status"] == "completed"
            assert "42" in result["result"] and "completed" in result["result"]
            events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
            assert [e["peer"] for e in events if e["event"] == "a2a.card"] == ["worker"]
            assert [e["state"] for e in events if e["event"] == "a2a.task_end"] == ["completed"]
            assert TOKEN not in stderr
            # the worker's served run really called the MCP tool
            assert any(r.tool_names and "sdk__add" in r.tool_names for r in gw.requests)

            code, result, stderr = await _parent(config, gw.url, "a-wrong-token-0000")
            assert code == 6 and result["status"] == "mcp_failed", stderr[-2000:]
            assert any(e.get("event") == "a2a.card_failed" and "HTTP 401" in e["error"]
                       for e in map(json.loads, filter(lambda x: x.startswith("{"), stderr.splitlines())))
    assert any('"a2a.served"' in line for line in lines)
