"""Subagent spawn benchmark: sync spawn latency, idle warm RSS, and a 50-way async fan-out.

    .venv/bin/python scripts/bench/spawn.py [--runs 10] [--fanout 50] [--write]

With ``--write`` the results replace the "Subagent spawns" section of docs/benchmarks.md.
Children are real re-execs of ``python -m agentd``; the "loop" rows run the real agent loop against the
scripted gateway from tests/peers (127.0.0.1), the "scripted" rows a trivial child with no model at all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import trio

ROOT_DIR = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT_DIR))

from agentd.config.model import Config  # noqa: E402
from agentd.events import null_log  # noqa: E402
from agentd.supervisor.caps import Caps  # noqa: E402
from agentd.supervisor.supervisor import (  # noqa: E402
    Caller,
    Origin,
    SpawnRequest,
    SupervisorSettings,
    open_supervisor,
)
from agentd.supervisor.wiring import open_root_supervisor  # noqa: E402
from tests.peers.gateway import scripted_gateway, text  # noqa: E402

ROOT = Caller(Origin.STDIO, "0")
BIG = Caps(max_children=256, max_subagents=256, spawn_burst=256, spawn_rate=1000.0)


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def tree_pids() -> list[int]:
    me = os.getpid()
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except FileNotFoundError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    out, stack = [], [me]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(parents.get(pid, ()))
    return out


def scripted(request: SpawnRequest, handle: str) -> dict:
    return json.loads(request.instruction)


ECHO = json.dumps({"steps": [["echo"]]})


async def bench(runs: int, fanout: int) -> dict:
    out: dict = {}
    settings = SupervisorSettings(caps=BIG)
    async with open_supervisor(settings=settings, test_script=scripted) as sup:
        await sup.spawn(ROOT, SpawnRequest(ECHO))  # warm the page cache
        lat = []
        for _ in range(runs):
            t = time.perf_counter()
            view = await sup.spawn(ROOT, SpawnRequest(ECHO))
            lat.append((time.perf_counter() - t) * 1000)
            assert view.status == "completed", view
        out["scripted_sync_ms"] = lat
        warm = [await sup.spawn(ROOT, SpawnRequest(ECHO, warm=True)) for _ in range(5)]
        await trio.sleep(0.5)
        out["scripted_warm_rss_kib"] = [rss_kib(sup._nodes[v.handle].pid) for v in warm]
        for v in warm:
            await sup.cancel(ROOT, v.handle)

        peak = 0
        done = trio.Event()

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, sum(rss_kib(p) for p in tree_pids()))
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            t = time.perf_counter()
            views = [await sup.spawn(ROOT, SpawnRequest(ECHO, async_=True)) for _ in range(fanout)]
            finals = [await sup.await_(ROOT, v.handle, timeout=120) for v in views]
            out["fanout_wall_s"] = time.perf_counter() - t
            done.set()
        out["fanout_ok"] = sum(1 for f in finals if f.status == "completed")
        out["fanout_peak_tree_rss_mib"] = peak / 1024

    first_request: list[float] = []

    def answer(request: object) -> dict:
        first_request.append(time.perf_counter())
        return text('{"ok": true}')

    async with scripted_gateway([]) as gw:
        cfg = Config(instruction="root", intelligence=(gw.url,), max_children=256, max_subagents=256)
        async with open_root_supervisor(cfg, log=null_log(), env={}) as sup:
            sup.authority.ledger._bucket.burst = 10_000  # benchmark many spawns; not a cap test
            sup.authority.ledger._bucket._tokens = 10_000.0
            to_first, loop_sync = [], []
            for _ in range(runs + 1):
                gw.push(answer)
                first_request.clear()
                t = time.perf_counter()
                view = await sup.spawn(ROOT, SpawnRequest("say ok"))
                loop_sync.append((time.perf_counter() - t) * 1000)
                to_first.append((first_request[0] - t) * 1000)
                assert view.status == "completed", view
            out["loop_to_first_model_request_ms"] = to_first[1:]
            out["loop_sync_ms"] = loop_sync[1:]
            gw.push(*[answer] * 3)
            warm = [await sup.spawn(ROOT, SpawnRequest("say ok", warm=True)) for _ in range(3)]
            await trio.sleep(0.5)
            out["loop_warm_rss_kib"] = [rss_kib(sup._nodes[v.handle].pid) for v in warm]
    return out


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f} (min {min(xs):.0f}, max {max(xs):.0f})"


def report(r: dict, runs: int, fanout: int) -> str:
    lines = [
        "## Subagent spawns",
        "",
        f"Command: `.venv/bin/python scripts/bench/spawn.py --runs {runs} --fanout {fanout} --write` "
        f"(2-core VM, {time.strftime('%Y-%m-%d')}, Python {sys.version.split()[0]}; re-exec of `python -m agentd`).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| sync spawn → result, scripted trivial child, ms (median of {runs}) | {med(r['scripted_sync_ms'])} |",
        f"| sync spawn → first model request, real loop child, ms | {med(r['loop_to_first_model_request_ms'])} |",
        f"| sync spawn → result, real loop child (1 model call), ms | {med(r['loop_sync_ms'])} |",
        f"| idle warm child RSS, scripted, MiB | {med([k / 1024 for k in r['scripted_warm_rss_kib']])} |",
        f"| idle warm child RSS, real loop after one turn, MiB | {statistics.median(r['loop_warm_rss_kib']) / 1024:.1f} |",
        f"| fan-out: {fanout} concurrent async scripted children, wall s | {r['fanout_wall_s']:.2f} ({r['fanout_ok']} completed) |",
        f"| fan-out: peak RSS of the whole tree, MiB | {r['fanout_peak_tree_rss_mib']:.0f} |",
        "",
    ]
    return "\n".join(lines)


def write_section(text_: str) -> None:
    path = ROOT_DIR / "docs" / "benchmarks.md"
    current = path.read_text() if path.exists() else "# Benchmarks\n\n"
    start = current.find("## Subagent spawns")
    if start >= 0:
        end = current.find("\n## ", start + 1)
        current = current[:start] + current[end + 1:] if end >= 0 else current[:start]
    path.write_text(current.rstrip("\n") + "\n\n" + text_)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--fanout", type=int, default=50)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    result = trio.run(bench, args.runs, args.fanout)
    section = report(result, args.runs, args.fanout)
    print(section)
    if args.write:
        write_section(section)


if __name__ == "__main__":
    main()
