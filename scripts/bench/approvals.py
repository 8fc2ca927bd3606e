"""What a pending approval costs a daemon: no process, and how much memory each one holds.

A daemon's runs (wakes, fires, the once run) are tasks of the daemon process, sharing its MCP pool and its
intelligence client. This runs ``--pending`` (1,000) such runs at once in one trio process the way a daemon
does (``agentd.run.run_with`` on one opened pool and gateway, with an approvals queue installed), each asking
for a tool marked ``approve`` against an instant in-process MCP server and a scripted gateway, and measures,
once every run waits:

- the child processes of this process (a pending approval holds none);
- the memory the waiting runs hold, per pending approval: Python's traced allocations (tracemalloc, after a
  warm-up run so imports and caches are not counted) and the growth of the resident set (VmRSS), each divided
  by the number pending. Each run holds its whole conversation (system prompt, instruction, the model's reply
  with the call) and its trio task besides the queue entry: the figure is what a waiting run costs, all in.

Then every approval is approved through the queue and the runs finish (the call is sent once each: checked).
With ``--write`` the "Pending approvals" section of docs/benchmarks.md is replaced.

    .venv/bin/python scripts/bench/approvals.py [--pending 1000] [--write]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_doc import replace_section  # noqa: E402  (scripts/bench is on sys.path when run)
from loop import serve_instant_mcp  # noqa: E402

from agentd.agent.budgets import Limits  # noqa: E402
from agentd.agent.runner import RunRequest  # noqa: E402
from agentd.config.model import McpServerConfig  # noqa: E402
from agentd.oversight.approvals import Approvals, Decision, use_approvals  # noqa: E402
from agentd.run import Gateway, open_run, run_with  # noqa: E402
from agentd.security.secrets import SecretResolver  # noqa: E402
from agentd.telemetry.events import EventLog  # noqa: E402
from tests.peers.gateway import Rule, scripted_gateway, text, tool_call  # noqa: E402

SECTION = "## Pending approvals"
TARGET_BYTES = 64 * 1024
#: Runs started at once (each waits in the queue before the next batch starts).
BATCH = 50


def _children() -> int:
    me = str(os.getpid())
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            count += 1
    return count


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def measure(pending: int) -> dict[str, Any]:
    queue = Approvals()
    log = EventLog(sink=lambda line: None, run_id="bench")
    rules = [Rule({"last_role": "tool"}, text("done"))]
    with use_approvals(queue):
        async with (
            serve_instant_mcp() as mcp_url,
            scripted_gateway(rules=rules, default=tool_call("srv__echo", {"text": "pay 12.50 to c-811"})) as gw,
            open_run(Gateway((gw.url,), "bench-model"), (McpServerConfig("srv", mcp_url, approve=("echo",)),),
                     log=log, secrets=SecretResolver(env={}), run_id="bench") as opened,
            trio.open_nursery() as nursery,
        ):
            finished: list[str] = []

            async def one(run_id: str) -> None:
                result = await run_with(RunRequest("Pay c-811.", run_id, Limits(max_steps=4, deadline=3600)),
                                        pool=opened.pool, intel=opened.intel, log=log.bind(run_id=run_id))
                assert result.status.value == "completed", result
                finished.append(run_id)

            async def settle(count: int) -> None:
                while len(queue.pending()) < count:
                    await trio.sleep(0.01)

            # warm-up: one run through the whole path (imports, caches, the pool's first calls)
            nursery.start_soon(one, "warm")
            await settle(1)
            queue.decide(queue.pending()[0].id, Decision("approve"))
            while "warm" not in finished:
                await trio.sleep(0.01)
            gc.collect()
            tracemalloc.start()
            traced_before, rss_before = tracemalloc.get_traced_memory()[0], _rss()
            started = time.perf_counter()
            for start in range(0, pending, BATCH):  # in batches: the local gateway is one process too
                for i in range(start, min(start + BATCH, pending)):
                    nursery.start_soon(one, f"r{i}")
                await settle(min(start + BATCH, pending))
            queued_s = time.perf_counter() - started
            gc.collect()
            traced_after, rss_after = tracemalloc.get_traced_memory()[0], _rss()
            tracemalloc.stop()
            children = _children()
            started = time.perf_counter()
            for item in queue.pending():
                queue.decide(item.id, Decision("approve"))
            while len(finished) < pending + 1:
                await trio.sleep(0.01)
            decided_s = time.perf_counter() - started
            calls = sum(1 for r in gw.requests if r.path.endswith("/chat/completions"))
    return {"pending": pending, "children": children, "traced_per": (traced_after - traced_before) / pending,
            "rss_per": (rss_after - rss_before) / pending, "queued_s": queued_s, "decided_s": decided_s,
            "model_calls": calls}


def report(m: dict[str, Any]) -> str:
    ok = m["children"] == 0 and m["traced_per"] <= TARGET_BYTES and m["rss_per"] <= TARGET_BYTES
    return f"""{SECTION}

{m['pending']:,} runs wait at once for a person's approval of a marked tool (`--approve srv__echo`), as a
daemon's wakes do: tasks of one process sharing one MCP pool and one gateway client (`scripts/bench/approvals.py`).
Target: no process per pending approval, at most 64 KiB each. {'Met.' if ok else 'MISSED.'}

| measure | value |
|---|---|
| child processes while {m['pending']:,} approvals wait | {m['children']} |
| memory per waiting run (traced Python allocations: conversation, task, queue entry) | {m['traced_per'] / 1024:.1f} KiB |
| resident set growth per waiting run (VmRSS) | {m['rss_per'] / 1024:.1f} KiB |
| time until all {m['pending']:,} waited (one model call each, against a local scripted gateway; started {BATCH} at a time; under tracemalloc) | {m['queued_s']:.2f} s |
| time from approving all to all finished (the call sent, one more model call each) | {m['decided_s']:.2f} s |

The figure is all in, and an upper bound: each waiting run keeps its conversation (system prompt, instruction,
the model's reply with the call) and its trio task, and the scripted gateway, in the same process, keeps a copy
of every request it received (the run's first request, a few KiB each); the queue entry itself is a few hundred
bytes. Nothing about the wait holds a process, a socket or a thread.

Reproduce: `.venv/bin/python scripts/bench/approvals.py --write`
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument("--write", action="store_true")
    options = parser.parse_args()
    measured = trio.run(measure, options.pending)
    text_ = report(measured)
    print(text_)
    if options.write:
        replace_section(SECTION, text_)


if __name__ == "__main__":
    main()
