"""Many processes journaling into one SQLite file at once: what a tree's children cost the journal itself.

    .venv/bin/python scripts/bench/writers.py [--processes 50] [--rounds 5] [--previous DIR]

``--processes`` processes are forked, wait at a start line, and each does what a journaled child does with
the tree's journal (agentd.child.turn): open the file, look for its run (the resume check), record a run of
two steps through :class:`~agentd.journal.recorder.RunRecorder` (``run.started``, a reply with one tool call,
its outcome, a final answer, ``run.ended``), drop its budget books, close. No model, no network: only the
journal. Wall time from the start line until every process is done, and the median process's CPU time.

With ``--previous DIR`` the same runs with the agentd of another checkout (each measurement a process of its
own, ``DIR`` first on its path, so that checkout's recorder decides which commits are flushed), the two
interleaved over ``--rounds`` rounds, the order alternating; medians and the ratio now ÷ previous.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

#: One measurement (argv: checkout, processes): prints "wall_ms cpu_ms".
_PROBE = """
import multiprocessing as mp, os, statistics, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import trio
from agentd.journal.ledger import drop_ledger
from agentd.journal.recorder import RunRecorder
from agentd.journal.records import RunStarted
from agentd.journal.sqlite import open_journal

async def child_run(state, i):
    async with open_journal(state) as journal:
        run = f"root/1.c{i}"
        await journal.read_run(run)
        recorder = RunRecorder(journal, run)
        await recorder.started(RunStarted("sha256:0", f"LEAF {i}", None, "0", None, "n"))
        await recorder.replied(1, {"role": "assistant", "content": None, "tool_calls": [{"id": "c1",
            "type": "function", "function": {"name": "subagent_status", "arguments": '{"handle": "0.999"}'}}]}, 90, 12)
        await recorder.observed(1, "c1", False, "no such subagent: 0.999")
        await recorder.replied(2, {"role": "assistant", "content": "leaf done"}, 120, 3)
        await recorder.ended("completed", {"status": "completed", "result": "leaf done"}, None)
        await drop_ledger(journal, run)

def child(state, i, go, out):
    go.wait()
    c0 = time.process_time()
    trio.run(child_run, state, i)
    out.put(time.process_time() - c0)

n = int(sys.argv[2])
with tempfile.TemporaryDirectory() as state:
    trio.run(child_run, state, -1)  # the file exists, as the root's would
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=child, args=(state, i, go, out)) for i in range(n)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    go.set()
    cpu = [out.get(timeout=300) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
print(wall * 1000, statistics.median(cpu) * 1000)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--previous", default=None, help="another checkout to interleave with")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parents[2])
    checkouts = {"now": here, **({"previous": args.previous} if args.previous else {})}
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in checkouts}
    for r in range(args.rounds):
        for name, where in list(checkouts.items())[:: 1 if r % 2 == 0 else -1]:
            done = subprocess.run([sys.executable, "-c", _PROBE, where, str(args.processes)], cwd=where,
                                  capture_output=True, text=True, check=True, timeout=600)
            wall, cpu = map(float, done.stdout.split())
            got[name].append((wall, cpu))
            print(name, f"wall {wall:.0f} ms, process CPU {cpu:.2f} ms", flush=True)
    med = {name: (statistics.median(w for w, _ in rows), statistics.median(c for _, c in rows))
           for name, rows in got.items()}
    for name, (wall, cpu) in med.items():
        print(f"{name}: wall {wall:.0f} ms, median process CPU {cpu:.2f} ms (medians of {args.rounds})")
    if "previous" in med:
        print(f"now ÷ previous: wall {med['now'][0] / med['previous'][0]:.2f}×, "
              f"CPU {med['now'][1] / med['previous'][1]:.2f}×")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
