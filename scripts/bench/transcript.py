"""Durable transcript throughput and loop latency: how much the SQLite writer (one worker thread behind a
limiter of 1) costs a run, per data policy.

    .venv/bin/python scripts/bench/transcript.py [--entries 5000] [--write]

Measures, per policy: entries committed per second when a run records as fast as it can (batched by the
writer), the worst trio scheduling delay seen by a ticker task meanwhile (does the loop stay responsive
while SQLite works?), and the cost of a step boundary (a ``synchronous=FULL`` commit, i.e. a WAL fsync).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import trio
from bench_doc import replace_section

from agentd.connections.transcript import Entry, open_transcript
from agentd.telemetry.events import null_log

SECTION = "## Durable transcript"


async def bench(policy: str, entries: int, directory: Path) -> dict[str, float]:
    path = str(directory / f"{policy}.sqlite3")
    worst_lag = 0.0

    async def ticker() -> None:
        nonlocal worst_lag
        while True:
            before = time.perf_counter()
            await trio.sleep(0.001)
            worst_lag = max(worst_lag, time.perf_counter() - before - 0.001)

    payload = {"content": "x" * 200, "tool_calls": [{"id": "c", "name": "a__b", "arguments": '{"q": "' + "y" * 100 + '"}'}]}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        async with open_transcript(path, run_id="bench", policy=policy, retention_days=0, manifest=None,
                                   log=null_log()) as transcript:  # fmt: skip
            started = time.perf_counter()
            for index in range(entries):
                transcript.record(Entry("s", "model.reply", role="assistant", content=payload,
                                        tool_value=index % 2 == 0))  # fmt: skip
                if index % 100 == 0:
                    await trio.sleep(0)
            await transcript.flush()
            elapsed = time.perf_counter() - started
            boundaries = []
            for _ in range(20):
                t0 = time.perf_counter()
                transcript.record(Entry("s", "step.end", content={"status": "completed"}, boundary=True))
                await transcript.flush()
                boundaries.append((time.perf_counter() - t0) * 1000)
            await transcript.end("completed", "done")
        nursery.cancel_scope.cancel()
    return {
        "entries_per_s": entries / elapsed,
        "worst_lag_ms": worst_lag * 1000,
        "boundary_ms": statistics.median(boundaries),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=5000)
    parser.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for policy in ("full", "redact_tool_values", "metadata_only"):
            result = trio.run(bench, policy, args.entries, Path(tmp))
            rows.append((policy, result))
            print(policy, {k: round(v, 2) for k, v in result.items()})
    if args.write:
        lines = [
            SECTION, "",
            f"Command: `.venv/bin/python scripts/bench/transcript.py --entries {args.entries} --write` (2-core VM, "
            f"{time.strftime('%Y-%m-%d')}; a shared machine, so treat numbers as rough). One run records "
            f"{args.entries} model-reply entries (~400 bytes each) as fast as it can; a ticker task measures the "
            "worst trio scheduling delay meanwhile; then 20 step boundaries (WAL fsync) are timed.", "",
            "| policy | entries committed / s | worst loop lag, ms | step boundary (fsync), median ms |",
            "|---|---|---|---|",
            *[f"| `{p}` | {r['entries_per_s']:.0f} | {r['worst_lag_ms']:.1f} | {r['boundary_ms']:.2f} |" for p, r in rows],
            "",
        ]  # fmt: skip
        replace_section(SECTION, "\n".join(lines))


if __name__ == "__main__":
    main()
