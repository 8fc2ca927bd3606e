"""What the agent loop adds to a step, and how many steps a second it runs.

One step is one model round trip plus one tool round trip. Against an instant scripted gateway (in
process, on 127.0.0.1) and an instant MCP server (in process, hypercorn, JSON replies), it runs a 200-step
``agentd.run.run_config`` (``--max-steps 200``; the gateway always asks for ``srv__echo``) and then
replays, with bare ``httpx``, exactly the gateway requests the run made and the same number of
``tools/call`` requests on a raw MCP session. agentd's overhead per step is

    (run wall time - raw model round trips - raw tool round trips) / steps

which covers prompt and catalogue handling, name mapping, schema validation, the gateway client's body
building and reply parsing, the MCP client, observations and event lines (serialised, as the real sink
does). Best of ``--repeat`` runs. With ``--write`` the "Agent loop" section of docs/benchmarks.md is
replaced.

    .venv/bin/python scripts/bench/loop.py [--steps 200] [--repeat 3] [--write]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio
from hypercorn.trio import serve

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_doc import replace_section  # noqa: E402  (scripts/bench is on sys.path when run)

from agentd.agent.budgets import Limits  # noqa: E402
from agentd.config.model import Config, IntelligenceConfig, McpServerConfig  # noqa: E402
from agentd.run import run_config  # noqa: E402
from agentd.telemetry.events import EventLog  # noqa: E402
from tests.peers.asgi import lifespan, read_body  # noqa: E402
from tests.peers.gateway import _hypercorn_config, scripted_gateway, tool_call  # noqa: E402

REPLY = tool_call("srv__echo", {"text": "hello from the benchmark"})
SECTION = "## Agent loop"
SESSION = "bench-session"


async def instant_mcp(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A minimal 2025-11-25 MCP server (ASGI, JSON replies, one ``echo`` tool) that answers at once."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    body = await read_body(receive)
    if scope["method"] != "POST":
        await _reply(send, 405, b"")
        return
    request = json.loads(body)
    method = request.get("method")
    if "id" not in request:
        await _reply(send, 202, b"")
        return
    if method == "initialize":
        result: dict[str, Any] = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                                  "serverInfo": {"name": "instant", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "echo", "description": "Echo.", "inputSchema": {
            "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": request["params"]["arguments"]["text"]}], "isError": False}
    else:
        result = {}
    payload = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode()
    await _reply(send, 200, payload, [(b"content-type", b"application/json"), (b"mcp-session-id", SESSION.encode())])


async def _reply(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = (headers or []) + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def serve_instant_mcp() -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, instant_mcp, _hypercorn_config(0, None, None)))
        yield binds[0] + "/mcp"
        nursery.cancel_scope.cancel()


def _sink() -> Any:
    def write(line: dict[str, Any]) -> None:
        json.dumps(line, ensure_ascii=False, default=str)  # the real sink's cost, without the terminal

    return write


async def _one_run(mcp_url: str, steps: int) -> tuple[float, float, list[bytes], int]:
    async with scripted_gateway(default=REPLY) as gw:
        cfg = Config(instruction="benchmark", intelligence=IntelligenceConfig(endpoints=(gw.url,)), mcp=(McpServerConfig("srv", mcp_url),))
        log = EventLog(sink=_sink(), run_id="bench")
        start, cpu = time.perf_counter(), time.process_time()
        result = await run_config(cfg, run_id="bench", log=log, limits=Limits(max_steps=steps, max_tokens=0,
                                                                               deadline=3600))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert result.steps == steps, result
        assert result.status.value == "exhausted_steps", result
        bodies = [json.dumps(r.body).encode() for r in gw.requests]
        # The run's own connect + handshake + tools/list are outside the steps: time them to subtract.
        return elapsed, cpu, bodies, len(gw.requests)


async def _connect_cost(mcp_url: str) -> tuple[float, float]:
    """Wall and CPU seconds of what a run pays once (opening the intelligence and the pool, handshake,
    listing, run.start/run.end): a one-step run minus one raw model round trip, best of 5."""
    async with scripted_gateway(default={"content": "done"}) as gw:
        cfg = Config(instruction="benchmark", intelligence=IntelligenceConfig(endpoints=(gw.url,)), mcp=(McpServerConfig("srv", mcp_url),))
        best, best_cpu = float("inf"), float("inf")
        for _ in range(5):
            start, cpu = time.perf_counter(), time.process_time()
            await run_config(cfg, run_id="bench", log=EventLog(sink=_sink()), limits=Limits(max_steps=1))
            best, best_cpu = min(best, time.perf_counter() - start), min(best_cpu, time.process_time() - cpu)
        body = json.dumps(gw.requests[0].body).encode()
        async with httpx.AsyncClient() as client:
            raw, raw_cpu = float("inf"), float("inf")
            for _ in range(20):
                t, c = time.perf_counter(), time.process_time()
                await client.post(gw.completions_url, content=body, headers={"content-type": "application/json"})
                raw, raw_cpu = min(raw, time.perf_counter() - t), min(raw_cpu, time.process_time() - c)
        return best - raw, best_cpu - raw_cpu


async def _raw_model(bodies: list[bytes]) -> tuple[float, float]:
    async with scripted_gateway(default=REPLY) as gw, httpx.AsyncClient() as client:
        for body in bodies[:20]:  # warm up
            await client.post(gw.completions_url, content=body, headers={"content-type": "application/json"})
        start, cpu = time.perf_counter(), time.process_time()
        for body in bodies:
            response = await client.post(gw.completions_url, content=body,
                                         headers={"content-type": "application/json"})
            response.json()
        return time.perf_counter() - start, time.process_time() - cpu


async def _raw_tool(mcp_url: str, calls: int) -> tuple[float, float]:
    params = {"name": "echo", "arguments": {"text": "hello from the benchmark"},
              "_meta": {"io.modelcontextprotocol/run-id": "bench"}}
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}).encode()
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-session-id": SESSION, "mcp-protocol-version": "2025-11-25"}
    async with httpx.AsyncClient() as client:
        for _ in range(20):
            await client.post(mcp_url, content=body, headers=headers)
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            response = await client.post(mcp_url, content=body, headers=headers)
            response.json()
        return time.perf_counter() - start, time.process_time() - cpu


class _InstantModel:
    """Answers every step at once with the same tool call: isolates the loop's own work."""

    def __init__(self) -> None:
        from agentd.intelligence.wire import ModelReply, ToolCall, Usage

        self.reply = ModelReply(None, (ToolCall("c1", "srv__echo", '{"text": "hello from the benchmark"}'),),
                                Usage(10, 5), "tool_calls")

    async def complete(self, messages: Any, tools: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return self.reply


class _InstantPool:
    """One in-memory ``echo`` tool: isolates the loop's own work from the MCP client's."""

    def __init__(self) -> None:
        from agentd.client.models import ToolInfo, ToolResult

        self.connections: dict[str, Any] = {"srv": None}
        self._tools = [ToolInfo("srv", "echo", "Echo.", {"type": "object", "properties": {"text": {"type": "string"}},
                                                         "required": ["text"]})]
        self._result = ToolResult

    def tools(self) -> Any:
        return list(self._tools)

    def resources(self) -> Any:
        return []

    def instructions(self) -> Any:
        return {}

    async def call_tool(self, server: str, tool: str, arguments: Any, *, run_id: str) -> Any:
        await trio.lowlevel.checkpoint()
        return self._result([{"type": "text", "text": arguments["text"]}], False)

    async def read_resource(self, uri: str, server: str | None = None) -> Any:
        raise NotImplementedError


async def loop_only(steps: int, repeat: int) -> float:
    """Seconds per step of the loop alone (prompt, catalogue, validation, observations, events)."""
    from agentd.agent.runner import RunRequest
    from agentd.run import run_with

    best = float("inf")
    for _ in range(repeat + 1):
        log = EventLog(sink=_sink(), run_id="bench")
        request = RunRequest("benchmark", "bench", Limits(max_steps=steps, max_tokens=0))
        start = time.perf_counter()
        await run_with(request, pool=_InstantPool(), intel=_InstantModel(), log=log)  # type: ignore[arg-type]
        best = min(best, (time.perf_counter() - start) / steps)
    return best


async def measure(steps: int, repeat: int) -> dict[str, Any]:
    async with serve_instant_mcp() as mcp_url:
        await _one_run(mcp_url, 10)  # warm up imports and caches
        connect, connect_cpu = await _connect_cost(mcp_url)
        best: dict[str, Any] | None = None
        for _ in range(repeat):
            elapsed, cpu, bodies, requests = await _one_run(mcp_url, steps)
            model, model_cpu = await _raw_model(bodies)
            tool, tool_cpu = await _raw_tool(mcp_url, steps)
            overhead = (elapsed - connect - model - tool) / steps
            cpu_overhead = (cpu - connect_cpu - model_cpu - tool_cpu) / steps
            row = {
                "steps": steps,
                "run_s": round(elapsed, 3),
                "steps_per_s": round(steps / elapsed, 1),
                "step_ms": round(elapsed / steps * 1000, 3),
                "raw_model_ms": round(model / requests * 1000, 3),
                "raw_tool_ms": round(tool / steps * 1000, 3),
                "connect_ms": round(connect * 1000, 1),
                "overhead_ms": round(overhead * 1000, 3),
                "cpu_overhead_ms": round(cpu_overhead * 1000, 3),
                "last_body_kb": round(len(bodies[-1]) / 1024, 1),
            }
            if best is None or row["cpu_overhead_ms"] < best["cpu_overhead_ms"]:
                best = row
        assert best is not None
        best["loop_only_ms"] = round(await loop_only(steps, repeat) * 1000, 3)
        best["load_average"] = round(os.getloadavg()[0], 2)
        best["cpus"] = os.cpu_count()
        return best


def render(row: dict[str, Any], command: str) -> str:
    return "\n".join([
        SECTION,
        "",
        "A run of `--max-steps` steps where the (instant, in-process) scripted gateway always asks for one",
        "`echo` on an instant in-process MCP server (hypercorn, JSON replies). The raw round trips",
        "replay the run's exact gateway requests and the same `tools/call` with bare httpx; the difference,",
        "minus the one-off connect/handshake, is what agentd adds per step (prompt/catalogue, validation, name",
        "mapping, gateway client, MCP client, observations, serialised event lines). Best of 3 runs.",
        "",
        "| steps | run (s) | steps/s | per step (ms) | raw model RT (ms) | raw tool RT (ms) | agentd overhead per step, wall (ms) | agentd overhead per step, CPU (ms) | last request body (KiB) |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {row['steps']} | {row['run_s']} | {row['steps_per_s']} | {row['step_ms']} | {row['raw_model_ms']} | "
        f"{row['raw_tool_ms']} | {row['overhead_ms']} | **{row['cpu_overhead_ms']}** | {row['last_body_kb']} |",
        "",
        "Both servers run in the benchmark's process, so the CPU column (process CPU time of the run minus that of",
        "the raw replays, per step) counts exactly the work agentd adds and is the number load disturbs least;",
        "the wall column also carries scheduling delays from other processes.",
        "",
        "Of that, the loop itself (prompt, catalogue, name map, jsonschema validation, observations, its event",
        f"lines; measured with in-memory stand-ins for the model and the pool): **{row['loop_only_ms']} ms** per step.",
        "The rest is the gateway client and the MCP client (httpx, JSON, their own events).",
        "",
        f"Target: under 1 ms of agentd overhead per step. Connect + handshake + listing (once per run): "
        f"{row['connect_ms']} ms. Machine: {row['cpus']} CPUs, load average {row['load_average']} while measuring",
        "(1-minute average; above ~1 other processes were competing for the 2 cores and wall numbers rise).",
        "",
        f"Reproduce: `{command}`",
        "",
    ])


def write_section(text: str) -> None:
    replace_section(SECTION, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    row = trio.run(measure, args.steps, args.repeat)
    print(json.dumps(row))
    text = render(row, ".venv/bin/python scripts/bench/loop.py" + (" --write" if args.write else ""))
    if args.write:
        write_section(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
