"""What tracing and OTLP metrics cost: the agent loop's CPU per step with ``--otel`` off, with tracing on,
and with tracing and OTLP metrics on (what ``--otel`` turns on), and the cost per MCP call of each.

The same 200-step run as scripts/bench/loop.py (instant in-process gateway and MCP server; each step is one
model call and one ``tools/call``), alternating the three in one process, best of ``--repeat`` each. With
tracing on, every step opens a ``chat`` span, an ``execute_tool`` span and a ``tools/call`` client span,
injects ``traceparent`` into the gateway headers and the request's ``_meta``, and the spans are exported at
the end of the run (OTLP/HTTP protobuf to an in-process receiver that discards them; the export is counted
in the run's CPU). With metrics on too, every step also records the schema's instruments and the metrics are
exported once at the end. Per MCP call: the client-span machinery alone (span, ``_meta`` injection,
outcome) and the metric recording alone, timed in tight loops; and the off path of the metric facade per
step (what every step pays with everything off).

    .venv/bin/python scripts/bench/telemetry.py [--steps 200] [--repeat 5] [--write]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import trio
from hypercorn.trio import serve

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

from bench_doc import replace_section  # noqa: E402
from loop import _one_run, serve_instant_mcp  # noqa: E402

from tests.peers.asgi import lifespan, read_body  # noqa: E402
from tests.peers.gateway import _hypercorn_config  # noqa: E402

SECTION = "## Tracing"


async def discard(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    await read_body(receive)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def per_mcp_call(n: int = 20000) -> float:
    """CPU seconds of the client-span machinery for one MCP request, tracing on."""
    from agentd import telemetry
    from agentd.telemetry.spans import mcp_client_span, with_trace_meta

    params = {"name": "echo", "arguments": {"text": "x"}}
    start = time.process_time()
    for _ in range(n):
        with mcp_client_span("srv", "tools/call", params, "2025-11-25") as span:
            with_trace_meta(params)
            span.set_attribute("jsonrpc.request.id", "7")
    elapsed = time.process_time() - start
    telemetry._tracing.queue.spans.clear()  # type: ignore[union-attr]
    return elapsed / n


def metric_calls(n: int = 20000) -> float:
    """CPU seconds of one step's metric calls (a model call, its step, one tool call, one MCP request)."""
    from agentd.telemetry import metrics

    start = time.process_time()
    for _ in range(n):
        metrics.gateway_call(0.001, "ok")
        metrics.step(10, 5)
        metrics.mcp_request("tools/call", "srv", 0.001)
        metrics.tool_call("srv", "result")
    return (time.process_time() - start) / n


def per_mcp_metric(n: int = 20000) -> float:
    """CPU seconds of recording one MCP request's duration, OTLP metrics on."""
    from agentd.telemetry import metrics

    start = time.process_time()
    for _ in range(n):
        metrics.mcp_request("tools/call", "srv", 0.001)
    return (time.process_time() - start) / n


async def off_only(steps: int, repeat: int) -> dict[str, Any]:
    """The tracing-off measurement alone, importing nothing of agentd.telemetry (runs on any tree)."""
    async with serve_instant_mcp() as mcp_url:
        await _one_run(mcp_url, 10)
        off = []
        for _ in range(repeat):
            _, cpu, _, _ = await _one_run(mcp_url, steps)
            off.append(cpu / steps)
    return {"steps": steps, "off_ms": round(min(off) * 1000, 3), "load_average": round(os.getloadavg()[0], 2)}


async def measure(steps: int, repeat: int) -> dict[str, Any]:
    from agentd import telemetry
    from agentd.telemetry import metrics
    from agentd.telemetry.settings import OtelSettings

    async with serve_instant_mcp() as mcp_url, trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, discard, _hypercorn_config(0, None, None)))
        settings = OtelSettings(traces_endpoint=binds[0] + "/v1/traces", metrics_endpoint=binds[0] + "/v1/metrics",
                                max_queue=100_000, max_batch=512)
        await _one_run(mcp_url, 10)  # warm up
        off: list[float] = []
        on: list[float] = []
        both: list[float] = []
        spans = 0
        for _ in range(repeat):
            telemetry.disable()
            metrics.disable()
            _, cpu, _, _ = await _one_run(mcp_url, steps)
            off.append(cpu / steps)
            telemetry.enable(settings)
            start = time.process_time()
            _, _, _, _ = await _one_run(mcp_url, steps)
            spans = len(telemetry._tracing.queue.spans)  # type: ignore[union-attr]
            await telemetry.flush(30)
            on.append((time.process_time() - start) / steps)
            metrics.enable_otel(settings)
            start = time.process_time()
            _, _, _, _ = await _one_run(mcp_url, steps)
            await telemetry.flush(30)
            await metrics.flush(30)
            both.append((time.process_time() - start) / steps)
            telemetry.disable()
            metrics.disable()
        off_path = metric_calls()
        telemetry.enable(settings)
        call = per_mcp_call()
        metrics.enable_otel(settings)
        metric = per_mcp_metric()
        telemetry.disable()
        metrics.disable()
        nursery.cancel_scope.cancel()
    return {
        "steps": steps,
        "off_ms": round(min(off) * 1000, 3),
        "on_ms": round(min(on) * 1000, 3),
        "both_ms": round(min(both) * 1000, 3),
        "added_ms": round((min(on) - min(off)) * 1000, 3),
        "added_metrics_ms": round((min(both) - min(on)) * 1000, 3),
        "ratio_on": round(min(on) / min(off), 3),
        "ratio_both": round(min(both) / min(off), 3),
        "spans_per_run": spans,
        "per_mcp_call_us": round(call * 1e6, 1),
        "per_mcp_metric_us": round(metric * 1e6, 1),
        "off_path_us": round(off_path * 1e6, 2),
        "load_average": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


def render(row: dict[str, Any], command: str) -> str:
    return "\n".join([
        SECTION,
        "",
        "The agent-loop run of \"Agent loop\" (one model call and one `tools/call` per step, instant in-process",
        "peers), alternating `--otel` off, tracing on, and tracing plus OTLP metrics on (what `--otel` turns on) in",
        "one process; process CPU per step of the whole run, best of the repeats. The spans, and the metrics, are",
        "exported at the run's end (OTLP/HTTP protobuf to an in-process receiver that discards them) and the",
        "exports are included. The ratios are to the off column of the same run.",
        "",
        "| steps | CPU per step, off (ms) | tracing on (ms) | tracing + OTLP metrics on (ms) | added per step: tracing / metrics (ms) | on / off | spans per run |",
        "|---|---|---|---|---|---|---|",
        f"| {row['steps']} | {row['off_ms']} | {row['on_ms']} | {row['both_ms']} | "
        f"**{row['added_ms']}** / **{row['added_metrics_ms']}** | {row['ratio_on']} / {row['ratio_both']} | "
        f"{row['spans_per_run']} |",
        "",
        "| per MCP call: client span and `_meta` (µs) | per MCP call: duration metric, OTLP on (µs) | "
        "per step: the metric calls with everything off (µs) |",
        "|---|---|---|",
        f"| {row['per_mcp_call_us']} | {row['per_mcp_metric_us']} | {row['off_path_us']} |",
        "",
        "Off is the default and imports nothing from OpenTelemetry (`python -X importtime` shows no",
        "`opentelemetry` module); its per-step cost is the loop's own (compare \"Agent loop\").",
        f"Machine: {row['cpus']} CPUs, load average {row['load_average']} while measuring.",
        "",
        f"Reproduce: `{command}`",
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--off-only", action="store_true", help="only tracing off (to compare another tree)")
    args = parser.parse_args()
    if args.off_only:
        print(json.dumps(trio.run(off_only, args.steps, args.repeat)))
        return
    row = trio.run(measure, args.steps, args.repeat)
    print(json.dumps(row))
    if args.write:
        replace_section(SECTION, render(row, ".venv/bin/python scripts/bench/telemetry.py --write"))


if __name__ == "__main__":
    main()
