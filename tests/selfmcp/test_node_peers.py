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

from tests.peers import conformance
from tests.selfmcp.harness import serving

pytestmark = [pytest.mark.interop, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
INSPECTOR = ROOT / ".peers" / "node_modules" / "@modelcontextprotocol" / "inspector-cli" / "build"

#: Every server scenario of conformance 0.1.16 that applies to a server with agentd's surface
#: (docs/self-mcp.md explains the others: they need fixture tools, prompts or methods agentd does not have).
APPLICABLE = ("server-initialize", "ping", "tools-list", "resources-list", "dns-rebinding-protection",
              "server-sse-multiple-streams")


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    # As a context manager, so its stdout pipe is closed too (an open one is a ResourceWarning).
    with subprocess.Popen([sys.executable, "-m", "tests.selfmcp.standalone"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:"), url
            yield url
        finally:
            proc.terminate()
            proc.wait(10)


async def test_conformance_suite_all_applicable_scenarios_pass(tmp_path: Path) -> None:
    if not conformance.available():
        pytest.skip("Node 22 or the conformance harness is not installed (scripts/test installs them)")
    async with serving() as served:
        run = await conformance.arun_server(served.url, out_dir=tmp_path, suite="all")
    for name in APPLICABLE:
        result = run.scenarios[name]
        assert result.ok, (name, result.failures())
    assert len(run.scenarios) == 32
    passing = sorted(name for name, r in run.scenarios.items() if r.failed == 0)
    # docs/self-mcp.md records this: the six above plus server-sse-polling (no scored checks here).
    assert passing == sorted([*APPLICABLE, "server-sse-polling"]), run.summary()


def _inspector(url: str, *args: str) -> dict:
    # The inspector finds its own package.json relative to the working directory.
    run = subprocess.run([str(conformance.node22()), "index.js", url, "--transport", "http", *args], cwd=INSPECTOR,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout[run.stdout.index("{"):])


def test_inspector_cli_lists_calls_and_reads(server_url: str) -> None:
    if not INSPECTOR.exists() or not conformance.available():
        pytest.skip("inspector-cli or Node 22 not installed")
    tools = _inspector(server_url, "--method", "tools/list")
    assert [t["name"] for t in tools["tools"]] == ["status", "subagent.spawn", "subagent.send",
                                                   "subagent.status", "subagent.cancel"]
    spawned = _inspector(server_url, "--method", "tools/call", "--tool-name", "subagent.spawn",
                         "--tool-arg", "instruction=hello")
    assert spawned["structuredContent"]["status"] == "completed"
    status = _inspector(server_url, "--method", "resources/read", "--uri", "agent://status")
    assert json.loads(status["contents"][0]["text"])["run_id"] == "run-test"
