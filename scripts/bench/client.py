"""Sequential ``tools/call`` round trips against one local official-SDK server: agentd's MCP client vs a bare
httpx POST loop vs the official SDK client, in the same run, on the same server.

    .venv/bin/python scripts/bench/client.py --calls 1000 --write

Each client connects (handshake), warms up, then makes ``--calls`` sequential ``tools/call echo`` calls; every
reply is fully parsed and checked. The three clients are interleaved in rounds so load drift hits them alike.
``--write`` replaces the "MCP client" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_doc import replace_section  # noqa: E402  (scripts/bench is on sys.path when run)

from agentd.client import open_mcp_pool  # noqa: E402
from agentd.config.model import McpServerConfig  # noqa: E402
from agentd.telemetry.events import null_log  # noqa: E402
from tests.peers import launch  # noqa: E402

ARGS = {"text": "hello bench"}


def _check(content: list[dict[str, Any]]) -> None:
    if content[0]["text"] != ARGS["text"]:
        raise AssertionError(content)


async def bench_agentd(url: str, calls: int, warmup: int) -> tuple[list[float], float]:
    async with open_mcp_pool([McpServerConfig("b", url)], log=null_log(), run_id="bench") as pool:
        for _ in range(warmup):
            await pool.call_tool("b", "echo", ARGS)
        times = []
        c0 = time.process_time()
        for _ in range(calls):
            t0 = time.perf_counter()
            result = await pool.call_tool("b", "echo", ARGS)
            times.append(time.perf_counter() - t0)
            _check(result.content)
        return times, time.process_time() - c0


def _parse_body(response: httpx.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                message: dict[str, Any] = json.loads(line[5:])
                if "id" in message:
                    return message
        raise AssertionError("no response in the stream")
    parsed: dict[str, Any] = response.json()
    return parsed


async def bench_httpx(url: str, calls: int, warmup: int) -> tuple[list[float], float]:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=None, trust_env=False) as client:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "bare", "version": "0"}}}
        response = await client.post(url, json=init, headers=headers)
        session = response.headers.get("mcp-session-id")
        if session:
            headers["Mcp-Session-Id"] = session
        headers["MCP-Protocol-Version"] = _parse_body(response)["result"]["protocolVersion"]
        await client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        times = []
        c0 = 0.0
        for i in range(warmup + calls):
            if i == warmup:
                c0 = time.process_time()
            body = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                    "params": {"name": "echo", "arguments": ARGS}}
            t0 = time.perf_counter()
            response = await client.post(url, content=json.dumps(body).encode(), headers=headers)
            message = _parse_body(response)
            elapsed = time.perf_counter() - t0
            _check(message["result"]["content"])
            if i >= warmup:
                times.append(elapsed)
        return times, time.process_time() - c0


async def bench_sdk(url: str, calls: int, warmup: int) -> tuple[list[float], float]:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(url) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            for _ in range(warmup):
                await session.call_tool("echo", ARGS)
            times = []
            c0 = time.process_time()
            for _ in range(calls):
                t0 = time.perf_counter()
                result = await session.call_tool("echo", ARGS)
                times.append(time.perf_counter() - t0)
                if result.content[0].text != ARGS["text"]:  # type: ignore[union-attr]
                    raise AssertionError(result)
            return times, time.process_time() - c0


CLIENTS = {"httpx": bench_httpx, "agentd": bench_agentd, "sdk": bench_sdk}


def run_mode(mode: str, calls: int, warmup: int, rounds: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Wall-clock samples per call, and client CPU seconds per call (this process only: the server is another)."""
    samples: dict[str, list[float]] = {name: [] for name in CLIENTS}
    cpu: dict[str, float] = dict.fromkeys(CLIENTS, 0.0)
    with launch.start_peer(launch.sdk_server_argv(mode=mode)) as peer:
        for _ in range(rounds):
            for name, fn in CLIENTS.items():
                times, spent = trio.run(fn, peer.url, calls // rounds, warmup)
                samples[name] += times
                cpu[name] += spent
    per_call = {name: cpu[name] / len(samples[name]) for name in CLIENTS}
    return samples, per_call


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--modes", default="stateful,json")
    parser.add_argument("--write", action="store_true", help="write the results into docs/benchmarks.md")
    args = parser.parse_args()
    rows = []
    for mode in args.modes.split(","):
        samples, cpu = run_mode(mode, args.calls, args.warmup, args.rounds)
        med = {name: statistics.median(v) * 1000 for name, v in samples.items()}
        us = {name: value * 1e6 for name, value in cpu.items()}
        rows.append(
            f"| {mode} | {med['httpx']:.3f} / {_ms(samples['httpx'], 0.95):.3f} "
            f"| {med['agentd']:.3f} / {_ms(samples['agentd'], 0.95):.3f} "
            f"| {med['sdk']:.3f} / {_ms(samples['sdk'], 0.95):.3f} "
            f"| {med['agentd'] / med['httpx']:.2f}x | {med['agentd'] / med['sdk']:.2f}x "
            f"| {us['httpx']:.0f} / {us['agentd']:.0f} / {us['sdk']:.0f} "
            f"| {us['agentd'] / us['httpx']:.2f}x | {us['agentd'] / us['sdk']:.2f}x |"
        )
        print(rows[-1], flush=True)
    command = (f".venv/bin/python scripts/bench/client.py --calls {args.calls} --warmup {args.warmup} "
               f"--rounds {args.rounds} --modes {args.modes} --write")
    section = "\n".join([
        "## MCP client",
        "",
        f"Command: `{command}` ({args.calls} sequential `tools/call echo` per client and mode, after "
        f"{args.warmup} warm-up calls; official SDK 2.x peer from tests/peers on 127.0.0.1; the three clients are "
        "interleaved in rounds on the same server). `httpx` is a bare httpx POST loop that parses the reply "
        "(JSON or SSE) and checks it; `agentd` is `pool.call_tool` (session, headers, `_meta` run id, typed result); "
        "`sdk` is the official SDK client (`streamable_http_client` + `ClientSession`, on trio).",
        "",
        "| server mode | httpx median / p95 (ms) | agentd median / p95 (ms) | SDK median / p95 (ms) "
        "| wall agentd ÷ httpx | wall agentd ÷ SDK | client CPU µs/call httpx / agentd / SDK "
        "| CPU agentd ÷ httpx | CPU agentd ÷ SDK |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Target: agentd within 1.2x of bare httpx and faster than the SDK client. Client CPU per call (this "
        "process's CPU time over the timed calls; the server is another process) is the "
        "figure that load on the shared 2-core machine distorts least; wall-clock medians include the server. "
        f"Load average during this run: {os.getloadavg()[0]:.1f}. The SDK peer sets TCP_NODELAY on its listening "
        "socket; without it every uvicorn response stalls ~40 ms on delayed ACK and all three clients measure that.",
        "",
    ])
    if args.write:
        replace_section("## MCP client", section)


if __name__ == "__main__":
    main()
