"""Per-process and per-run set-up costs, in CPU time (what load on a shared machine disturbs least).

* TLS: what one ``httpx.AsyncClient`` costs to build with ``verify=True`` (httpx loads the CA bundle every
  time; what each run paid twice before) against agentd's client with the process's cached context, and
  with the no-CA context agentd uses when every endpoint is plain ``http``.
* Catalogue per wake: a reactive daemon builds a catalogue per run from the same 20 MCP tools and the
  control tools it registers afresh (``resource.read``, the self-tools, ``subagent.*``, ``graph.run``).
* Run set-up per wake: a one-step ``run_with`` with in-memory stand-ins for the model and the pool
  (prompt, catalogue, one model turn, one tool call, events), the wake's own CPU before any network.

Each figure is the best of ``--repeat`` rounds of ``--n`` calls, CPU ms per call.

    .venv/bin/python scripts/bench/costs.py [--n 200] [--repeat 5] [--write]

With ``--write`` the "Start-up and per-run costs" section of docs/benchmarks.md is replaced. The same
script runs against an older tree (``PYTHONPATH=<tree>``) for before/after figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # PYTHONPATH (an older tree) wins over this checkout

from bench_doc import replace_section  # noqa: E402  (scripts/bench is on sys.path when run)

from agentd.agent import catalogue  # noqa: E402
from agentd.agent.budgets import Limits  # noqa: E402
from agentd.agent.builtin import resource_read_tool  # noqa: E402
from agentd.agent.control import ControlToolRegistry  # noqa: E402
from agentd.client.models import ToolInfo, ToolResult  # noqa: E402
from agentd.intelligence.wire import ModelReply, ToolCall, Usage  # noqa: E402
from agentd.modes.selftools import SelfRequests, self_tools  # noqa: E402
from agentd.supervisor.graph import graph_tool  # noqa: E402
from agentd.supervisor.supervisor import Caller, Origin  # noqa: E402
from agentd.supervisor.tools import subagent_tools  # noqa: E402
from agentd.telemetry.events import EventLog  # noqa: E402
from agentd.transport.http_client import new_client  # noqa: E402

SECTION = "## Start-up and per-run costs"


def best_ms(fn: Callable[[], object], n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - start) / n)
    return best * 1000


def sink() -> Callable[[dict[str, Any]], None]:
    def write(line: dict[str, Any]) -> None:
        json.dumps(line, ensure_ascii=False, default=str)  # the real sink's serialisation

    return write


def mcp_tools(count: int = 20) -> list[ToolInfo]:
    return [
        ToolInfo("srv", f"tool_{i}", f"Tool number {i}: does something useful with its arguments.", {
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer", "minimum": 1},
                           "mode": {"enum": ["a", "b", "c"]}, f"extra_{i}": {"type": "boolean"}},
            "required": ["path"],
        })
        for i in range(count)
    ]


class Pool:
    """In memory: the same ToolInfo objects on every call, as a connected pool hands them out."""

    def __init__(self) -> None:
        self.connections: dict[str, Any] = {"srv": None}
        self._tools = mcp_tools()

    def tools(self) -> list[ToolInfo]:
        return list(self._tools)

    def resources(self) -> list[Any]:
        return []

    def instructions(self) -> dict[str, str]:
        return {}

    async def call_tool(self, server: str, tool: str, arguments: Any, *, run_id: str, idempotency_key: str = "",
                        resume_task: str | None = None, on_task: Any = None) -> ToolResult:
        return ToolResult([{"type": "text", "text": "ok"}], False)

    async def read_resource(self, uri: str, server: str | None = None) -> Any:
        raise NotImplementedError


class Model:
    def __init__(self) -> None:
        self.turn = 0

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        self.turn += 1
        if self.turn % 2:
            return ModelReply(None, (ToolCall("c1", "srv__tool_3", '{"path": "/x"}'),), Usage(10, 5), "tool_calls")
        return ModelReply("done", (), Usage(10, 5), "stop")


def wake_controls(pool: Pool) -> ControlToolRegistry:
    """What the reactive daemon registers for every wake (new ControlTool objects each time)."""
    registry = ControlToolRegistry()
    registry.register(resource_read_tool(pool))  # type: ignore[arg-type]
    for tool in self_tools(SelfRequests()):
        registry.register(tool)
    caller = Caller(Origin.STDIO, "0")
    for tool in subagent_tools(None, caller):  # type: ignore[arg-type]  # handlers are never called here
        registry.register(tool)
    registry.register(graph_tool(None, caller))  # type: ignore[arg-type]
    return registry


def measure(n: int, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["client_verify_true_ms"] = best_ms(lambda: httpx.AsyncClient(verify=True, trust_env=False), max(5, n // 20),
                                           repeat)
    out["client_agentd_ms"] = best_ms(new_client, n, repeat)
    try:
        from agentd.transport.tls import plain_context
    except ImportError:
        out["client_plain_ms"] = None
    else:
        out["client_plain_ms"] = best_ms(lambda: new_client(verify=plain_context()), n, repeat)

    pool = Pool()
    log = EventLog(sink=sink(), run_id="bench")
    tools = pool.tools()
    out["controls"] = len(list(wake_controls(pool)))
    if hasattr(catalogue, "catalogues_for"):  # the pool's Catalogues, as a run finds it
        def build() -> Any:
            return catalogue.catalogues_for(pool).build(pool.tools(), wake_controls(pool), log=log)
    else:  # an older tree (module-level caches)
        def build() -> Any:
            return catalogue.build_catalogue(pool.tools(), wake_controls(pool), log=log)
    out["catalogue_ms"] = best_ms(build, n, repeat)
    out["tools"] = len(tools)

    from agentd.agent.runner import RunRequest
    from agentd.run import run_with

    async def one_wake() -> None:
        request = RunRequest("Report the counter.", "bench.1", Limits(max_steps=4, max_tokens=0))
        result = await run_with(request, pool=pool, intel=Model(), log=log,  # type: ignore[arg-type]
                                controls=wake_controls(pool))
        assert result.steps == 2, result

    def wake() -> None:
        trio.run(one_wake)

    empty = best_ms(lambda: trio.run(trio.lowlevel.checkpoint), n, repeat)
    out["run_setup_ms"] = best_ms(wake, n, repeat) - empty
    out["load"] = os.getloadavg()[0]
    return out


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def render(r: dict[str, Any], command: str) -> str:
    return f"""{SECTION}

Command: `{command}` (CPU time per call, best of rounds; load average {r['load']:.1f}).

| what | CPU ms |
|---|---|
| `httpx.AsyncClient(verify=True)` (loads the CA bundle each time) | {fmt(r['client_verify_true_ms'])} |
| agentd `new_client()` (https: the process's cached context) | {fmt(r['client_agentd_ms'])} |
| agentd client for plain-http endpoints (no CA loaded) | {fmt(r['client_plain_ms'])} |
| catalogue per wake ({r['tools']} MCP tools + {r['controls']} control tools registered afresh) | {fmt(r['catalogue_ms'])} |
| run set-up per wake: one-step `run_with`, in-memory model and pool, events serialised | {fmt(r['run_setup_ms'])} |
"""


def write_section(section: str) -> None:
    replace_section(SECTION, section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    result = measure(args.n, args.repeat)
    print(json.dumps(result))
    command = ".venv/bin/python scripts/bench/costs.py" + (f" --n {args.n}" if args.n != 200 else "") + (
        f" --repeat {args.repeat}" if args.repeat != 5 else "") + " --write"
    section = render(result, command)
    print(section)
    if args.write:
        write_section(section)


if __name__ == "__main__":
    main()
