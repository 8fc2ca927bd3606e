"""What a child process imports: the fork server's image and a real-loop child's turn stay off heavy modules.

Every module the fork server imports is resident in each forked child (RSS, and private pages once a turn
touches it); every module a re-exec'd child imports is start-up CPU. The interpreter runs under
``-X importtime`` (a wrapper script as the children's Python), so the record is what the real processes
imported, not a guess: the fork server's and a re-exec child's lines go to a file, a forked child's lazily
imported modules arrive on its stderr (relayed as ``subagent.stderr``).
"""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest
import trio

from agentd.config.model import Config, IntelligenceConfig
from agentd.supervisor.node import NodeSettings
from agentd.supervisor.supervisor import Caller, Origin, SpawnRequest, SupervisorSettings, open_supervisor
from agentd.supervisor.wiring import config_to_wire
from agentd.telemetry.events import EventLog, RateLimiter
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call

ROOT = Caller(Origin.STDIO, "0")

#: Never on a child's path (no MCP servers, telemetry off): CLIs and their renderers, the served side, YAML, JWT and crypto, OpenTelemetry, the A2A SDK
#: and pydantic, and the daemon's own modes and terminal views.
NEVER = ("rich", "click", "pygments", "markdown_it", "hypercorn", "wsproto", "yaml", "jwt", "cryptography",
         "opentelemetry", "google", "pydantic", "a2a", "starlette", "uvicorn",
         "agentd.daemon", "agentd.selfmcp", "agentd.terminal", "agentd.modes")

_IMPORT = re.compile(r"import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)")


def _imported(text_: str) -> set[str]:
    """The modules ``-X importtime`` lists, less click: the sitecustomize below refuses it, and importtime lists a
    refused import too."""
    return {m.group(1) for m in _IMPORT.finditer(text_)} - {"click"}


#: httpx imports its own optional command-line client (click, rich, pygments) whenever click can be imported, as
#: it can in the test environment (uvicorn needs it) and cannot beside agentd alone: that import is httpx's, not
#: agentd's, so the children here run as they would where agentd is installed on its own, with the start-up
#: bench's site directory that refuses click (scripts/bench/plain_site says why).
PLAIN_SITE = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "plain_site"


def _importtime_python(tmp_path: Path) -> tuple[Path, Path]:
    """A Python for the children that records its imports (``-X importtime``) into the returned file."""
    record = tmp_path / "importtime.txt"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{PLAIN_SITE}${{PYTHONPATH:+:$PYTHONPATH}}" '
                      f'exec {sys.executable} -X importtime "$@" 2>>{record}\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return record, python


def _offenders(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NEVER))


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "re-exec"])
async def test_a_real_child_and_its_fork_server_import_no_heavy_module(tmp_path: Path, no_leftover_children,
                                                                       fork_server: bool) -> None:
    record, python = _importtime_python(tmp_path)
    lines: list[dict] = []
    log = EventLog(sink=lines.append, level="debug", limiter=RateLimiter(limit=0))
    async with scripted_gateway([text('{"ok": true}')]) as gw:
        wire = config_to_wire(Config(instruction="root", intelligence=IntelligenceConfig(endpoints=(gw.url,))))
        settings = SupervisorSettings(node=NodeSettings(python=str(python)))
        with trio.fail_after(60):
            async with open_supervisor(settings=settings, child_config=wire, log=log, fork_server=fork_server) as sup:
                view = await sup.spawn(ROOT, SpawnRequest("say ok"))
                forked = sup.statistics().fork_server_pid is not None
    assert view.status == "completed", view
    assert forked is fork_server
    seen = _imported(record.read_text())
    seen |= _imported("\n".join(e.get("line", "") for e in lines if e["event"] == "subagent.stderr"))
    assert {"trio", "httpx", "agentd.client", "agentd.intelligence"} <= seen  # the record is real
    assert _offenders(seen) == []


async def test_a_forked_childs_first_spawn_imports_nothing(tmp_path: Path, no_leftover_children) -> None:
    """A forked child's own spawn (a tool call, checked against its schema) runs on what the fork server has
    imported and compiled: jsonschema once cost each spawning child 50-90 ms of CPU on its first call."""
    _, python = _importtime_python(tmp_path)
    lines: list[dict] = []
    log = EventLog(sink=lines.append, level="debug", limiter=RateLimiter(limit=0))

    def answer(request: RecordedRequest) -> dict:
        first_user = next(str(m.get("content")) for m in request.messages if m.get("role") == "user")
        if "level 1" in first_user and request.last_message.get("role") != "tool":
            spawn = next(n for n in request.tool_names if n.startswith("subagent") and n.endswith("spawn"))
            return tool_call(spawn, {"instruction": "level 2"})
        return text('{"ok": true}')

    async with scripted_gateway([], default=answer) as gw:
        wire = config_to_wire(Config(instruction="root", intelligence=IntelligenceConfig(endpoints=(gw.url,))))
        settings = SupervisorSettings(node=NodeSettings(python=str(python)))
        with trio.fail_after(60):
            async with open_supervisor(settings=settings, child_config=wire, log=log, fork_server=True) as sup:
                view = await sup.spawn(ROOT, SpawnRequest("level 1"))
    assert view.status == "completed", view
    assert len(gw.requests) == 3, view  # level 1 asks to spawn, level 2 answers, level 1 ends: a real nested spawn
    lazily = _imported("\n".join(e.get("line", "") for e in lines if e["event"] == "subagent.stderr"))
    assert sorted(m for m in lazily if m.split(".")[0] in ("jsonschema", "referencing", "rpds")) == []
