"""Spawn throughput and idle supervision cost, before/after in one run: fan-out, burst, idle pings.

    .venv/bin/python scripts/bench/spawnrate.py [--fanout 50] [--burst 500] [--idle-children 200]
        [--ping-interval 1] [--idle 10] [--rounds 3] [--before DIR] [--after DIR] [--parts fanout,burst,idle]

Every child is a real scripted agentd process (no model) forked from the tree's fork server:

- **fanout**: ``--fanout`` async spawns one after the other (each returns once its child is forked), then
  every result awaited: wall s, and the root's / fork server's CPU per spawn.
- **burst**: ``--burst`` warm spawns started at once: spawns per second until every child answered its
  first turn; CPU per spawn of the root, the fork server and a child (scheduler ns, load-independent).
- **idle**: ``--idle-children`` idle warm children pinged every ``--ping-interval`` s for ``--idle`` s:
  the root's CPU per ping, and what that makes per idle child per minute at the default 30 s interval.

Each part runs in a fresh process. With ``--before DIR`` (a tree holding an ``agentd`` package, e.g.
``git archive main agentd | tar -x -C /tmp/before``) every part runs alternately on that tree and on this
one, ``--rounds`` times each, and the report gives medians and the after/before ratio measured in the same
run, so machine load moves both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT_DIR = Path(__file__).resolve().parents[2]


def _cpu_ms(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6
    except (OSError, ValueError, IndexError):
        return float("nan")


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _minor_faults(pid: int) -> int:
    """Minor page faults so far (a forked child's are mostly copy-on-write copies of the server's pages)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[7])
    except (OSError, ValueError, IndexError):
        return 0


def _reaped_children_cpu_ms(pid: int) -> float:
    """CPU of the children ``pid`` has reaped (``cutime + cstime``, clock ticks): the fork server reaps them."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[13]) + int(fields[14])) * 1000 / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def one(part: str, n: int, ping_interval: float, idle: float) -> dict[str, Any]:
    """One measurement in this process, with whichever ``agentd`` is first on sys.path."""
    import trio

    from agentd.supervisor.caps import Caps
    from agentd.supervisor.liveness import LivenessSettings
    from agentd.supervisor.supervisor import Caller, Origin, SpawnRequest, SupervisorSettings, open_supervisor

    root = Caller(Origin.STDIO, "0")
    echo = json.dumps({"steps": [["echo"]]})
    caps = Caps(max_children=n + 8, max_subagents=n + 8, spawn_burst=n + 8, spawn_rate=10_000.0)
    liveness = LivenessSettings(idle_ping_interval=ping_interval) if part == "idle" else LivenessSettings()
    out: dict[str, Any] = {}

    async def main() -> None:
        async with open_supervisor(settings=SupervisorSettings(caps=caps, liveness=liveness),
                                   test_script=lambda r, h: json.loads(r.instruction), fork_server=True) as sup:
            await sup.spawn(root, SpawnRequest(echo))  # starts the fork server
            assert sup._fork_server is not None
            assert sup._fork_server.proc is not None
            server = sup._fork_server.proc.pid
            reaped0 = _reaped_children_cpu_ms(server)
            cpu0, server0, start = time.process_time(), _cpu_ms(server), time.perf_counter()
            views: list[Any] = []
            if part == "fanout":
                views = [await sup.spawn(root, SpawnRequest(echo, async_=True)) for _ in range(n)]
                out["spawned_s"] = time.perf_counter() - start
                finals = [await sup.await_(root, v.handle, timeout=120) for v in views]
                out["ok"] = sum(1 for f in finals if f.status == "completed")
            else:
                async def spawn_one() -> None:
                    views.append(await sup.spawn(root, SpawnRequest(echo, warm=True)))

                async with trio.open_nursery() as nursery:
                    for _ in range(n):
                        nursery.start_soon(spawn_one)
                out["ok"] = sum(1 for v in views if v.status == "awaiting_turn")
            wall = time.perf_counter() - start
            root_cpu, server_cpu = time.process_time() - cpu0, _cpu_ms(server) - server0
            out["wall_s"] = wall
            out["rate_per_s"] = n / wall
            out["root_cpu_ms_per_spawn"] = root_cpu * 1000 / n
            out["server_cpu_ms_per_spawn"] = server_cpu / n
            if part == "fanout":
                await trio.sleep(0.5)  # the last exits reaped
                out["child_cpu_ms"] = (_reaped_children_cpu_ms(server) - reaped0) / n
                return
            pids = [sup._nodes[v.handle].pid for v in views]
            out["child_cpu_ms"] = statistics.mean(_cpu_ms(p) for p in pids if p)
            out["child_minor_faults"] = statistics.median(_minor_faults(p) for p in pids if p)
            out["child_pss_mib"] = statistics.median(_pss_kib(p) for p in pids[:50] if p) / 1024
            if part != "idle":
                return
            await trio.sleep(4.0)  # past each session's last working-pace ping
            nodes = [sup._nodes[v.handle] for v in views]
            seq0 = [getattr(node, "_ping_seq", None) for node in nodes]
            cpu1 = time.process_time()
            await trio.sleep(idle)
            used = (time.process_time() - cpu1) * 1000
            pings = n * idle / ping_interval
            if None not in seq0:  # a tree that counts its pings: per ping actually sent
                pings = sum(getattr(node, "_ping_seq") - s for node, s in zip(nodes, seq0, strict=True))
                out["pings_per_child_per_interval"] = pings / n / (idle / ping_interval)
            out["root_us_per_ping"] = used * 1000 / pings
            out["root_ms_per_child_min_at_30s"] = used / pings * 2  # two pings a minute at the default

    trio.run(main)
    out["load"] = os.getloadavg()[0]
    return out


def run_part(tree: str, part: str, n: int, ping_interval: float, idle: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(
        [sys.executable, __file__, "--one", part, "--n", str(n), "--ping-interval", str(ping_interval),
         "--idle", str(idle)], env=env, cwd=tree,  # the fork server's ``python -m agentd`` finds the tree's own
        capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{part} on {tree} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fanout", type=int, default=50)
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--idle-children", type=int, default=200)
    parser.add_argument("--ping-interval", type=float, default=1.0)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default=None, help="a tree holding the agentd package to compare with")
    parser.add_argument("--after", default=str(ROOT_DIR), help="the tree measured as after (default: this one)")
    parser.add_argument("--parts", default="fanout,burst,idle")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.n, args.ping_interval, args.idle)))
        return
    sizes = {"fanout": args.fanout, "burst": args.burst, "idle": args.idle_children}
    trees = {"after": str(Path(args.after).resolve())}
    if args.before:
        trees = {"before": str(Path(args.before).resolve()), **trees}
    report: dict[str, Any] = {}
    for part in args.parts.split(","):
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():  # alternate, so load drifts hit both sides
                runs[name].append(run_part(tree, part, sizes[part], args.ping_interval, args.idle))
                print(part, name, json.dumps(runs[name][-1]), file=sys.stderr, flush=True)
        medians = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
        if "before" in medians:
            medians["after/before"] = {key: medians["after"][key] / medians["before"][key]
                                       for key in medians["after"] if medians["before"].get(key)}
        report[part] = medians
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
