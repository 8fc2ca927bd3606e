"""Served MCP tasks: what creating a task costs the serving daemon against a served async spawn.

    .venv/bin/python scripts/bench/tasks.py [--creations 40] [--rounds 5] [--write]

A real serving agentd (``--serve-tasks``, scripted gateway in this process answering at once, spawn-rate limit
lifted) and one 2025-11-25 session. Each round makes ``--creations`` task-augmented ``subagent.spawn`` calls
(``params.task``: the answer is a CreateTaskResult, the run goes on) and as many ``async: true`` spawns (the
answer is a handle), interleaved in blocks, each block waiting until its runs ended. Measured: the daemon
process's own CPU (user + system from /proc, its children's excluded: both kinds start the same subagent
process) per creation, and the wall time of the creating call. Target: task creation ÷ async spawn ≤ 1.1×.
"""

from __future__ import annotations

import argparse
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

from bench_doc import replace_section  # noqa: E402

from tests.integration.agents import agentd_worker  # noqa: E402
from tests.peers.gateway import scripted_gateway, text  # noqa: E402
from tests.selfmcp.harness import LegacyPeer  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int) -> float:
    """The process's own user + system CPU so far, ms (not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICKS


async def block(peer: LegacyPeer, kind: str, n: int, pid: int) -> tuple[float, list[float]]:
    """``n`` creations of ``kind``; the daemon's CPU per creation (to the runs' ends) and each call's wall ms."""
    before = cpu_ms(pid)
    walls: list[float] = []
    ids: list[str] = []
    for i in range(n):
        arguments: dict[str, Any] = {"instruction": f"{kind} {i}"}
        params: dict[str, Any] = {"name": "subagent.spawn", "arguments": arguments}
        if kind == "task":
            params["task"] = {"ttl": 60000}
        else:
            arguments["async"] = True
        started = time.perf_counter()
        answer = await peer.call("tools/call", params)
        walls.append((time.perf_counter() - started) * 1000)
        result = answer["result"]
        ids.append(result["task"]["taskId"] if kind == "task" else result["structuredContent"]["handle"])
    for ident in ids:  # the same work after the creation for both: wait for every run's end
        while True:
            if kind == "task":
                status = (await peer.call("tasks/get", {"taskId": ident}))["result"]["status"]
            else:
                status = (await peer.call("tools/call", {"name": "subagent.status", "arguments": {"handle": ident}})
                          )["result"]["structuredContent"]["status"]
            if status not in ("working", "running", "queued"):
                break
            await trio.sleep(0.02)
    return (cpu_ms(pid) - before) / n, walls


async def measure(creations: int, rounds: int) -> dict[str, Any]:
    cpu: dict[str, list[float]] = {"task": [], "async": []}
    wall: dict[str, list[float]] = {"task": [], "async": []}
    async with scripted_gateway(default=text("done", usage={"prompt_tokens": 3, "completion_tokens": 2})) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-tasks", "--intelligence", gw.url,
                "--spawn-rate", "1000", "--spawn-burst", "1000", "--serve-max-spawns", "64"]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=60) as client:
            peer = LegacyPeer(client, worker.url)
            await peer.initialize()
            await block(peer, "async", 5, worker.pid)  # warm-up: the fork server, the first child
            await block(peer, "task", 5, worker.pid)
            for r in range(rounds):
                for kind in (("task", "async") if r % 2 == 0 else ("async", "task")):
                    per, walls = await block(peer, kind, creations, worker.pid)
                    cpu[kind].append(per)
                    wall[kind] += walls
    return {"cpu": {k: statistics.median(v) for k, v in cpu.items()},
            "wall": {k: statistics.median(v) for k, v in wall.items()}, "rounds": rounds, "creations": creations,
            "raw": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--creations", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    out = trio.run(measure, args.creations, args.rounds)
    cpu, wall = out["cpu"], out["wall"]
    ratio_cpu, ratio_wall = cpu["task"] / cpu["async"], wall["task"] / wall["async"]
    print(f"daemon CPU per creation: task {cpu['task']:.2f} ms, async spawn {cpu['async']:.2f} ms "
          f"({ratio_cpu:.2f}x); call wall median: task {wall['task']:.2f} ms, async {wall['async']:.2f} ms "
          f"({ratio_wall:.2f}x)")
    if args.write:
        load = os.getloadavg()[0]
        replace_section("## Served tasks", "\n".join([
            "## Served tasks",
            "",
            f"Command: `.venv/bin/python scripts/bench/tasks.py --creations {args.creations} --rounds {args.rounds} "
            f"--write` (2-core VM, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, 1-minute load average "
            f"{load:.2f} at the end). A serving agentd with `--serve-tasks`, one 2025-11-25 session: task-augmented "
            "`subagent.spawn` calls (a CreateTaskResult) against `async: true` spawns (a handle), in interleaved "
            "blocks, each block waiting for its runs' ends; the daemon process's own CPU per creation (its "
            "subagent processes excluded: both kinds start the same one), medians over the rounds, and the "
            "creating call's wall time, median over every call.",
            "",
            "| measure | task | async spawn | task ÷ async (target ≤ 1.1) |",
            "|---|---|---|---|",
            f"| daemon CPU per creation | {cpu['task']:.2f} ms | {cpu['async']:.2f} ms | **{ratio_cpu:.2f}** |",
            f"| creating call, wall | {wall['task']:.2f} ms | {wall['async']:.2f} ms | {ratio_wall:.2f} |",
            "",
            "Each round, daemon CPU per creation, ms: task "
            + ", ".join(f"{v:.2f}" for v in out["raw"]["task"]) + "; async "
            + ", ".join(f"{v:.2f}" for v in out["raw"]["async"]) + ".",
        ]))


if __name__ == "__main__":
    main()
