"""MCP tasks held by a daemon: memory and CPU per pending served task and per task being polled, processes held.

    .venv/bin/python scripts/bench/task_waits.py [--tasks 1000] [--poll-ms 5000] [--window 60] [--write]

Real processes throughout: a throwaway PostgreSQL (tests/postgres.py), the project's tasks-extension peer
(tests/peers/servers/modern_only_server.py ``--tasks``, SEP-2663 on the 2026-07-28 wire: its ``research`` tool
always runs as a task, ``working`` for as long as asked, suggesting ``--poll-ms`` between polls), the scripted
gateway in this process, and two ``agentd --cluster`` members on the database:

- the serving member, ``--serve-mcp --serve-tasks --cluster-capacity 0``: it runs nothing; ``--tasks``
  task-augmented ``subagent.spawn`` calls over one 2025-11-25 session make it hold that many **pending served
  tasks** (each a queued cluster row it answers ``tasks/get`` for and watches for its end);
- the working member, ``--cluster-capacity`` = ``--tasks`` with the peer as its MCP server (``call_timeout:
  2h``): it claims every row and runs
  it in its own process; each run's model asks for ``research`` (for an hour), so each run holds one **task
  being polled** at the peer (``tasks/get`` every ``--poll-ms``).

Measured from /proc, each member against itself just before the tasks were created: the growth of its
resident set (VmRSS) and of its proportional set size (``Pss`` of smaps_rollup) divided by ``--tasks``; its
own CPU (user + system) over ``--window`` seconds once every task is held, divided by the tasks (per task per
minute) and, for the working member, by the ``tasks/get`` the peer answered in the window (per poll); its child
processes. Target: no process per wait, ≤ 64 KiB each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_doc import replace_section  # noqa: E402  (scripts/bench is on sys.path when run)

from tests.peers import launch  # noqa: E402
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call  # noqa: E402
from tests.postgres import PASSWORD, start_server  # noqa: E402
from tests.selfmcp.harness import LegacyPeer  # noqa: E402

SECTION = "## MCP tasks held by a daemon"
TICKS = os.sysconf("SC_CLK_TCK")
TARGET_KIB = 64


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def memory_kib(pid: int) -> tuple[int, int]:
    """VmRSS and Pss, KiB."""
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:"))
    pss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
               if line.startswith("Pss:"))
    return rss, pss


def children(pid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                    count += 1
            except OSError:
                pass
    return count


def reply(request: RecordedRequest) -> dict[str, Any]:
    if any(m.get("role") == "tool" for m in request.messages):
        return text("researched")
    return tool_call("srv__research", {"topic": "the bench", "seconds": 3600})


async def member(stack: AsyncExitStack, argv: list[str], log: Path, env: dict[str, str]) -> trio.Process:
    sink = stack.enter_context(log.open("wb"))
    proc = await trio.lowlevel.open_process(argv, stdout=subprocess.DEVNULL, stderr=sink, env=env, cwd=ROOT)
    stack.push_async_callback(_stop, proc)
    with trio.fail_after(120):
        while b'"cluster.joined"' not in log.read_bytes():
            assert proc.poll() is None, log.read_text()[-3000:]
            await trio.sleep(0.1)
    return proc


async def _stop(proc: trio.Process) -> None:
    if proc.poll() is None:
        proc.kill()
    with trio.move_on_after(10):
        await proc.wait()


def served_url(log: Path) -> str:
    for line in log.read_text().splitlines():
        if '"serve.start"' in line:
            return str(json.loads(line)["urls"][0])
    raise RuntimeError("no serve.start")


async def measure(dsn: str, env: dict[str, str], tasks: int, poll_ms: int, window: float, tmp: Path
                  ) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        gw = await stack.enter_async_context(scripted_gateway(default=reply))
        peer = await stack.enter_async_context(launch.peer_server(
            [*launch.modern_server_argv(tasks=True), "--poll-ms", str(poll_ms)]))
        base = [sys.executable, "-m", "agentd", "--cluster", dsn, "--intelligence", gw.url, "--deadline", "2h",
                "--cluster-lease-ttl", "30s"]
        serving = await member(stack, [*base, "--cluster-capacity", "0", "--serve-mcp", "http://127.0.0.1:0/mcp",
                                       "--serve-tasks", "--serve-max-queued", str(tasks + 10)],
                               tmp / "serving.stderr", env)
        config = tmp / "working.yaml"  # the call (the task) may last the hour the tool is asked to take
        config.write_text(f"mcp_servers:\n  - name: srv\n    url: {peer.url}\n    call_timeout: 2h\n")
        working = await member(stack, [*base, "--cluster-capacity", str(tasks), "--config", str(config)],
                               tmp / "working.stderr", env)
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=120))
        legacy = LegacyPeer(client, served_url(tmp / "serving.stderr"))
        await legacy.initialize()
        await trio.sleep(2)  # both members settled (first heartbeat, first claim poll)
        before = {"serving": memory_kib(serving.pid), "working": memory_kib(working.pid)}
        ids = []
        for i in range(tasks):
            answer = await legacy.call("tools/call", {"name": "subagent.spawn", "task": {"ttl": 3_600_000},
                                                      "arguments": {"instruction": f"research {i}"}})
            ids.append(answer["result"]["task"]["taskId"])
        side = f"{peer.url.removesuffix('/mcp')}/_test"
        # Every run's tools/call made its task, but for one whose call failed on the connection (not re-sent: it
        # is not idempotent; that run then ends): wait until the count stops growing.
        held_tasks, still = 0, 0
        with trio.fail_after(1800):
            while held_tasks < tasks and still < 15:
                await trio.sleep(1)
                now = len((await client.get(f"{side}/tasks")).json()["tasks"])
                still = still + 1 if now == held_tasks and now > 0 else 0
                held_tasks = now
        await trio.sleep(poll_ms / 1000 * 2)  # every task polled at least once
        held = {"serving": memory_kib(serving.pid), "working": memory_kib(working.pid)}
        gets0 = (await client.get(f"{side}/stats")).json()["requests"].get("tasks/get", 0)
        cpu0 = {"serving": cpu_s(serving.pid), "working": cpu_s(working.pid)}
        await trio.sleep(window)
        cpu1 = {"serving": cpu_s(serving.pid), "working": cpu_s(working.pid)}
        gets1 = (await client.get(f"{side}/stats")).json()["requests"].get("tasks/get", 0)
        kids = {"serving": children(serving.pid), "working": children(working.pid)}
        working = 0
        for task_id in ids:
            working += (await legacy.call("tasks/get", {"taskId": task_id}))["result"]["status"] == "working"
        state = (await client.get(f"{side}/tasks")).json()
        waiting = sum(1 for t in state["tasks"].values() if t["status"] == "working")
    polls = gets1 - gets0
    out: dict[str, Any] = {"tasks": tasks, "poll_ms": poll_ms, "window_s": window, "polls": polls,
                           "load": os.getloadavg()[0], "pending": working, "polled": waiting}
    for who, n in (("serving", max(working, 1)), ("working", max(waiting, 1))):
        out[who] = {
            "rss_kib": round((held[who][0] - before[who][0]) / n, 1),
            "pss_kib": round((held[who][1] - before[who][1]) / n, 1),
            "cpu_ms_per_task_per_min": round((cpu1[who] - cpu0[who]) * 1000 / n / (window / 60), 3),
            "children": kids[who],
        }
    out["working"]["cpu_ms_per_poll"] = round((cpu1["working"] - cpu0["working"]) * 1000 / max(polls, 1), 3)
    return out


def section(r: dict[str, Any], command: str) -> str:
    s, w = r["serving"], r["working"]
    met = max(s["rss_kib"], s["pss_kib"], w["rss_kib"], w["pss_kib"]) <= TARGET_KIB and not (s["children"]
                                                                                          or w["children"])
    return "\n".join([
        SECTION,
        "",
        f"Command: `{command}` (2-core VM, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, 1-minute load "
        f"average {r['load']:.1f} at the end; the machine was shared with other sessions). Two real `agentd "
        "--cluster` members on a throwaway PostgreSQL, the project's tasks-extension peer (SEP-2663, 2026-07-28 "
        f"wire) suggesting {r['poll_ms']} ms between polls, the scripted gateway: the serving member "
        f"(`--serve-mcp --serve-tasks --cluster-capacity 0`) holds {r['tasks']} pending served tasks "
        "(task-augmented `subagent.spawn` calls: queued cluster rows it answers `tasks/get` for and watches); "
        f"the working member (`--cluster-capacity {r['tasks']}`, the peer its MCP server with `call_timeout: 2h`) claims them all and each run "
        "waits on a `research` task it polls at the peer. Each member against itself before the tasks were "
        f"created, divided by the tasks it still held at the end (a run whose `tools/call` failed on the "
        f"connection is not re-sent and ends: it holds no task); CPU over {r['window_s']:g} s once all were held. "
        "Target: no process per wait, ≤ 64 KiB each.",
        "",
        "| measure | per pending served task (serving member) | per task being polled (working member) |",
        "|---|---|---|",
        f"| tasks held at the end (of {r['tasks']} created) | {r['pending']} pending | {r['polled']} polled |",
        f"| child processes while they are held | {s['children']} | {w['children']} |",
        f"| resident set growth (VmRSS) | {s['rss_kib']} KiB | {w['rss_kib']} KiB |",
        f"| proportional set size growth (Pss) | {s['pss_kib']} KiB | {w['pss_kib']} KiB |",
        f"| CPU per task per minute | {s['cpu_ms_per_task_per_min']} ms | {w['cpu_ms_per_task_per_min']} ms |",
        f"| CPU per `tasks/get` poll | — | {w['cpu_ms_per_poll']} ms ({r['polls']} polls in the window, of "
        f"{round(r['tasks'] * r['window_s'] * 1000 / r['poll_ms'])} at the suggested interval) |",
        "",
        f"Met: {'yes' if met else 'no'}. The working member's figure is a whole waiting run, all in: its "
        "conversation, its own model client (its connection to the gateway closed when the task started: the "
        "next model call connects anew), its journal and its lease (renewed at every heartbeat; the MCP pool is "
        "the member's, shared) besides the task wait itself, which is a sleeping trio task between polls. The "
        "serving member's is the served handle, its task state and its watch of the row's end.",
        "",
        "Earlier (2026-12-07, loaded machine): 245 KiB per task being polled at 200 tasks while a claimed run opened "
        "an MCP pool of its own (its connection, session and tool catalogue: now the member's runs share one pool, "
        "as a daemon's wakes do); 65.7 KiB at 1,000 (02:39, load 3.9) while each run's gateway client drew its "
        "retry jitter from a `random.Random` of its own (2.9 KiB of generator state; now one for the process: "
        "63.6 KiB with that alone, 04:37, load 10.1) and kept its connection to the gateway alive through the "
        "wait (the httpcore and h11 objects of a kept-alive connection, about 3 KiB per client measured alone; "
        "62.7 KiB with both changes, 04:48, load 16.8, while a released pool was still rebuilt at once rather than "
        "at the next request; a repeat of the figure above, 05:07 at load 10.5: 59.4 KiB RSS, 59.2 Pss). "
        "Sharing the member's one model client instead measured 50 KiB, but then a thousand runs' model calls "
        "queue on its four connections and trip its one breaker together (255 of 1,000 runs ended "
        "`intelligence_failed` before their first answer), so each run keeps its own. Every watched cluster "
        "handle used to re-read its row and its run every 5 s: 13.5 ms of the serving member's CPU per pending "
        "task per minute (now one statement for every watched row every 5 s). The CPU of a poll is mostly the "
        "HTTP request itself (httpx, httpcore and the socket's system calls, in a profile of the working member), "
        "and it grows with the machine's load: 1.97 ms at load 3.9 (02:39), 3.55 ms at load 10.1 before the "
        "gateway connection was let go during the wait (04:37) and 3.13 ms at load 10.5 after (05:07; the polls "
        "go to the MCP server, not the gateway); "
        "with `--poll-ms 5000` at load 18.6 the single-process peer did not keep up (882 polls in 60 s of 12,000).",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--poll-ms", type=int, default=5000)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    server = start_server()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT", "PG"))}
        env["PGPASSWORD"] = PASSWORD
        tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"task_waits.{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        result = trio.run(measure, server.dsn(server.new_database()), env, args.tasks, args.poll_ms, args.window,
                          tmp)
    finally:
        server.close()
    print(json.dumps(result, indent=2))
    if args.write:
        command = (f".venv/bin/python scripts/bench/task_waits.py --tasks {args.tasks} --poll-ms {args.poll_ms} "
                   f"--window {args.window:g} --write")
        replace_section(SECTION, section(result, command))


if __name__ == "__main__":
    main()
