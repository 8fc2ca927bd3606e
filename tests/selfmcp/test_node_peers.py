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


#: conformance 0.2.0-alpha.12 (``conformance-next``), server mode, ``--suite all``: the scenarios that pass. The
#: ones marked vacuous have no scored check against this surface (they need a fixture or an extension agentd lacks).
NEXT_PASSING = ("server-initialize", "server-session-lifecycle", "ping", "tools-list", "resources-list",
                "server-sse-multiple-streams", "dns-rebinding-protection", "http-header-validation",
                "sep-2164-resource-not-found", "input-required-result-missing-input-response",
                "input-required-result-unsupported-methods", "input-required-result-ignore-extra-params",
                "input-required-result-validate-input", "sep-2640-skills-directory", "sep-2640-skills-enumeration",
                "sep-2640-skills-manifest", "server-sse-polling", "tasks-status-notifications")
#: The failing ones, by why; docs/self-mcp.md lists every one of them with the same reason.
NEXT_FIXTURES = (
    "logging-set-level", "completion-complete", "tools-call-simple-text", "tools-call-image", "tools-call-audio",
    "tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-with-logging", "tools-call-error",
    "tools-call-with-progress", "tools-call-sampling", "tools-call-elicitation", "json-schema-2020-12",
    "elicitation-sep1034-defaults", "elicitation-sep1330-enums", "resources-read-text", "resources-read-binary",
    "resources-templates-read", "resources-subscribe", "resources-unsubscribe", "prompts-list", "prompts-get-simple",
    "prompts-get-with-args", "prompts-get-embedded-resource", "prompts-get-with-image", "caching",
    "http-custom-header-server-validation", "input-required-result-basic-elicitation",
    "input-required-result-basic-sampling", "input-required-result-basic-list-roots",
    "input-required-result-request-state", "input-required-result-multiple-input-requests",
    "input-required-result-multi-round", "input-required-result-non-tool-request",
    "input-required-result-result-type", "input-required-result-tampered-state",
    "input-required-result-capability-check",
)
NEXT_TASKS = ("tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields", "tasks-request-state-removal",
              "tasks-mrtr-input", "tasks-request-headers", "tasks-dispatch-and-envelope", "tasks-required-task-error",
              "tasks-mrtr-composition")
#: server-stateless: the checks agentd fails, each explained in docs/self-mcp.md (they need diagnostic fixture
#: tools); every other check of the scenario passes, the -32022 list and the modern-wire initialize among them.
NEXT_STATELESS_PASSING = frozenset({
    "sep-2575-server-unsupported-version-error", "sep-2575-http-server-method-not-found-404-initialize",
})
NEXT_STATELESS_FAILURES = frozenset({
    "sep-2575-server-rejects-undeclared-capability", "sep-2575-missing-capability-http-400",
    "sep-2575-http-server-no-independent-requests-on-stream", "sep-2575-server-no-log-without-loglevel",
})


async def test_conformance_next_server_scenarios(tmp_path: Path) -> None:
    """0.2.0-alpha.12 against the served endpoint: every scenario passes or is a documented expected failure."""
    conformance.require(conformance.NEXT_ENTRY)
    async with serving() as served:
        run = await conformance.arun_server(served.url, out_dir=tmp_path, suite="all", entry=conformance.NEXT_ENTRY,
                                            timeout=600)
    expected_failing = {*NEXT_FIXTURES, *NEXT_TASKS, "server-stateless"}
    assert set(run.scenarios) == {*NEXT_PASSING, *expected_failing}, sorted(run.scenarios)  # nothing unlisted
    for name in NEXT_PASSING:
        assert run.scenarios[name].failed == 0, (name, run.scenarios[name].failures())
    for name in expected_failing:  # a stale entry (now passing) must be moved to NEXT_PASSING and the docs
        assert run.scenarios[name].failed > 0, name
    stateless = run.scenarios["server-stateless"]
    failed = {c["id"] for c in stateless.checks if c.get("status") == "FAILURE"}
    assert failed == NEXT_STATELESS_FAILURES and stateless.passed >= 22, stateless.failures()
    passed = {c["id"] for c in stateless.checks if c.get("status") == "SUCCESS"}
    assert NEXT_STATELESS_PASSING <= passed, sorted(NEXT_STATELESS_PASSING - passed)
    docs = (ROOT / "docs" / "self-mcp.md").read_text()
    for name in sorted({*expected_failing, *NEXT_STATELESS_FAILURES}):
        assert f"`{name}`" in docs, f"docs/self-mcp.md does not explain {name}"


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
