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

from bench_doc import replace_section  # noqa: E402  (scripts/bench is on sys.path when run)

from agentd.config.model import Config, IntelligenceConfig, SubagentsConfig  # noqa: E402
from agentd.supervisor.caps import Caps  # noqa: E402
from agentd.supervisor.supervisor import (  # noqa: E402
    Caller,
    Origin,
    SpawnRequest,
    SupervisorSettings,
    open_supervisor,
)
from agentd.supervisor.wiring import open_root_supervisor  # noqa: E402
from agentd.telemetry.events import null_log  # noqa: E402
from tests.peers.gateway import scripted_gateway, text  # noqa: E402

ROOT = Caller(Origin.STDIO, "0")
BIG = Caps(max_children=256, max_subagents=256, spawn_burst=256, spawn_rate=1000.0)


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kib(pid: int) -> int:
    """Proportional set size: shared pages (a fork server's imports) divided among their sharers."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def len_key(handle: str) -> tuple[int, int]:
    return (handle.count("."), int(handle.rsplit(".", 1)[-1]))


def cpu_ms(pid: int) -> float:
    """CPU time the process has used: a load-independent start-up cost. From the scheduler's nanosecond
    count (``/proc/PID/schedstat``); the tick-based ``stat`` fields are 10 ms coarse, too coarse for a fork."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6
    except (OSError, ValueError, IndexError):
        return float("nan")


def tree_pids() -> list[int]:
    me = os.getpid()
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
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
    return {mode: await bench_mode(runs, fanout, fork=mode == "forked") for mode in ("re-exec", "forked")}


async def bench_mode(runs: int, fanout: int, fork: bool) -> dict:
    out: dict = {}
    settings = SupervisorSettings(caps=BIG)
    async with open_supervisor(settings=settings, test_script=scripted, fork_server=fork) as sup:
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
        out["scripted_warm_pss_kib"] = [pss_kib(sup._nodes[v.handle].pid) for v in warm]
        for v in warm:
            await sup.cancel(ROOT, v.handle)

        peak = 0  # PSS of every descendant (shared pages counted once across the tree)
        done = trio.Event()

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, sum(pss_kib(p) for p in tree_pids() if p != os.getpid()))
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
    child_cpu: list[float] = []
    current: list[int] = []

    def answer(request: object) -> dict:
        first_request.append(time.perf_counter())
        if current:
            child_cpu.append(cpu_ms(current[-1]))
        return text('{"ok": true}')

    async with scripted_gateway([], default=answer) as gw:
        cfg = Config(instruction="root", intelligence=IntelligenceConfig(endpoints=(gw.url,)), subagents=SubagentsConfig(max_children=256, max_total=256), )
        async with open_root_supervisor(cfg, log=null_log(), env={}, fork_server=fork) as sup:
            sup.authority.ledger._bucket.burst = 10_000  # benchmark many spawns; not a cap test
            sup.authority.ledger._bucket._tokens = 10_000.0
            to_first, loop_sync = [], []
            for _ in range(runs + 1):
                first_request.clear()
                t = time.perf_counter()
                current.clear()
                before = len(sup._nodes)
                async with trio.open_nursery() as nursery:
                    async def spot() -> None:
                        while len(sup._nodes) == before or sup._nodes[max(sup._nodes, key=len_key)].pid is None:
                            await trio.sleep(0.001)
                        current.append(sup._nodes[max(sup._nodes, key=len_key)].pid)
                    nursery.start_soon(spot)
                    view = await sup.spawn(ROOT, SpawnRequest("say ok"))
                loop_sync.append((time.perf_counter() - t) * 1000)
                assert first_request, (fork, view)
                to_first.append((first_request[0] - t) * 1000)
                assert view.status == "completed", view
            out["loop_to_first_model_request_ms"] = to_first[1:]
            out["loop_child_cpu_at_first_request_ms"] = child_cpu[1:]
            out["loop_sync_ms"] = loop_sync[1:]
            warm = [await sup.spawn(ROOT, SpawnRequest("say ok", warm=True)) for _ in range(3)]
            assert all(v.status == "awaiting_turn" for v in warm), warm
            await trio.sleep(0.5)
            assert all(sup._nodes[v.handle].status == "awaiting_turn" for v in warm), [
                sup._nodes[v.handle].view() for v in warm]
            out["loop_warm_rss_kib"] = [rss_kib(sup._nodes[v.handle].pid) for v in warm]
            out["loop_warm_pss_kib"] = [pss_kib(sup._nodes[v.handle].pid) for v in warm]
    return out


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f} (min {min(xs):.0f}, max {max(xs):.0f})"


def report(results: dict, runs: int, fanout: int) -> str:
    a, b = results["re-exec"], results["forked"]

    def mib(xs: list[int]) -> str:
        return f"{statistics.median(xs) / 1024:.1f}"

    rows = [
        (f"sync spawn → result, trivial scripted child, ms (median of {runs})",
         med(a["scripted_sync_ms"]), med(b["scripted_sync_ms"])),
        ("sync spawn → first model request, real loop child, ms",
         med(a["loop_to_first_model_request_ms"]), med(b["loop_to_first_model_request_ms"])),
        ("child CPU time used by its first model request, ms (load-independent)",
         med(a["loop_child_cpu_at_first_request_ms"]), med(b["loop_child_cpu_at_first_request_ms"])),
        ("sync spawn → result, real loop child (one model call), ms", med(a["loop_sync_ms"]), med(b["loop_sync_ms"])),
        ("idle warm child, scripted: RSS / PSS MiB", f"{mib(a['scripted_warm_rss_kib'])} / {mib(a['scripted_warm_pss_kib'])}",
         f"{mib(b['scripted_warm_rss_kib'])} / {mib(b['scripted_warm_pss_kib'])}"),
        ("idle warm child, real loop after one turn: RSS / PSS MiB",
         f"{mib(a['loop_warm_rss_kib'])} / {mib(a['loop_warm_pss_kib'])}",
         f"{mib(b['loop_warm_rss_kib'])} / {mib(b['loop_warm_pss_kib'])}"),
        (f"fan-out: {fanout} concurrent async scripted children, wall s",
         f"{a['fanout_wall_s']:.2f} ({a['fanout_ok']} ok)", f"{b['fanout_wall_s']:.2f} ({b['fanout_ok']} ok)"),
        ("fan-out: peak PSS of the children (incl. fork server), MiB",
         f"{a['fanout_peak_tree_rss_mib']:.0f}", f"{b['fanout_peak_tree_rss_mib']:.0f}"),
    ]
    lines = [
        "## Subagent spawns",
        "",
        f"Command: `.venv/bin/python scripts/bench/spawn.py --runs {runs} --fanout {fanout} --write` "
        f"(2-core VM, {time.strftime('%Y-%m-%d')}, Python {sys.version.split()[0]}, load average "
        f"{os.getloadavg()[0]:.1f} at the end, which the fan-out itself raises; with other load, wall times are upper bounds).",
        "`re-exec` starts `python -m agentd` per child; `forked` forks it from the pre-imported fork server "
        "(the default for a root built from a Config). The first spawn of each mode is excluded (it starts the "
        "fork server / warms the page cache).",
        "",
        "| measure | re-exec | forked |",
        "|---|---|---|",
        *[f"| {name} | {x} | {y} |" for name, x, y in rows],
        "",
    ]
    return "\n".join(lines)


def write_section(text_: str) -> None:
    replace_section("## Subagent spawns", text_)


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
