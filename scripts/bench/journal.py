"""Run journal: what one step's append costs the trio thread, and how many steps per second SQLite takes.

    .venv/bin/python scripts/bench/journal.py [--steps 2000] [--write]

A step is the batch the loop commits after each model turn: a model reply with one tool call, the tool
call's request and outcome, and the usage (4 records, ~0.9 KB of JSON). The bench appends ``--steps``
steps to one run, each awaited as the loop would, and measures:

- CPU time of the trio thread per step (``time.thread_time`` around the loop): the hand-off to the worker
  thread and back, which is what a step costs the event loop (JSON encoding and SQLite run on the worker);
- wall time per append (median, p99) and steps / records committed per second;
- the same with ``durable=True`` (``synchronous=FULL``: an fsync of the WAL per step), median wall;
- the budget books (``--token-ceiling`` with ``--state-dir``): each model reply also saves its run tree's
  books (one more durable commit); a step with that save against the step alone, measured in the same run
  (wall and trio-thread CPU, and their ratios);
- the worst trio scheduling delay seen by a 1 ms ticker task during a run of appends;
- the floor: trio-thread CPU of a bare ``trio.to_thread.run_sync`` of a no-op under the same limiter;
- durability (``--durability``): a step committed as agentd commits it now (``durable=True``:
  ``synchronous=FULL``, an fsync of the WAL, through the group commit) against the way it was committed before
  (``synchronous=NORMAL``, one transaction per step on the worker thread, no grouping), with 1 and
  ``--concurrent`` runs appending at once; CPU per step of the trio thread and of the whole process (the
  worker thread's encoding and SQLite included), wall per step, and the ratios new ÷ before: medians over
  ``--rounds`` interleaved rounds. Then the same step as the loop commits it (two commits: the reply with
  its call's request and the usage, then the outcome): now (the reply ``durable=True``, the outcome not, the
  recorder's policy, grouped) against before (both ``synchronous=NORMAL``, ungrouped) and against every
  commit durable (both ``durable=True``, grouped: the policy before it flushed only what is acted on).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import trio
from bench_doc import replace_section

from agentd.journal.ledger import Ledger, save_ledger
from agentd.journal.records import ModelReply, RunStarted, ToolCallOutcome, ToolCallRequested, Usage
from agentd.journal.sqlite import JournalFile, db_path, open_journal

SECTION = "## Run journal"


def step(n: int) -> list:
    call = f"call-{n}"
    arguments = '{"query": "' + "q" * 80 + '"}'
    return [
        ModelReply(n, {"role": "assistant", "content": "Let me look that up. " * 4,
                       "tool_calls": [{"id": call, "name": "docs__search", "arguments": arguments}]}),
        ToolCallRequested(n, call, "docs__search", {"query": "q" * 80}),
        ToolCallOutcome(n, call, True, "result line " * 30),
        Usage(n, 1200 + 40 * n, 60),
    ]


async def bench(steps: int, durable_steps: int, state_dir: str) -> dict[str, float]:
    batches = [step(n) for n in range(steps)]
    async with open_journal(state_dir) as journal:
        await journal.append("warm", [RunStarted("d", "warm-up")])
        for n in range(50):
            await journal.append("warm", batches[n])
        await journal.append("bench", [RunStarted("d", "bench")])
        latencies = []
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        for batch in batches:
            t0 = time.perf_counter()
            await journal.append("bench", batch)
            latencies.append(time.perf_counter() - t0)
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0

        durable = []
        for n in range(durable_steps):
            t0 = time.perf_counter()
            await journal.append("durable", batches[n], durable=True)
            durable.append(time.perf_counter() - t0)

        books = Ledger(100_000)  # a tree with three subagent slices, charged every reply
        for h in ("0.1", "0.2", "0.3"):
            books.reserve(h, 10_000)
        plain, booked, plain_cpu, booked_cpu = [], [], 0.0, 0.0
        for n in range(durable_steps):  # interleaved, so both see the same disk and load
            c0, t0 = time.thread_time(), time.perf_counter()
            await journal.append("plain", batches[n])
            plain.append(time.perf_counter() - t0)
            plain_cpu += time.thread_time() - c0
            c0, t0 = time.thread_time(), time.perf_counter()
            await journal.append("booked", batches[n])
            books.charge("0.1", 100)
            await save_ledger(journal, "booked", books)
            booked.append(time.perf_counter() - t0)
            booked_cpu += time.thread_time() - c0

        limiter = trio.CapacityLimiter(1)
        cpu0 = time.thread_time()
        for _ in range(steps):
            await trio.to_thread.run_sync(lambda: None, limiter=limiter)
        floor = (time.thread_time() - cpu0) / steps

        worst_lag = 0.0
        async with trio.open_nursery() as nursery:

            async def ticker() -> None:
                nonlocal worst_lag
                while True:
                    before = time.perf_counter()
                    await trio.sleep(0.001)
                    worst_lag = max(worst_lag, time.perf_counter() - before - 0.001)

            nursery.start_soon(ticker)
            for batch in batches[:500]:
                await journal.append("lag", batch)
            nursery.cancel_scope.cancel()
    latencies.sort()
    return {
        "loop_cpu_ms": cpu / steps * 1000,
        "handoff_floor_ms": floor * 1000,
        "wall_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "steps_per_s": steps / wall,
        "records_per_s": 4 * steps / wall,
        "durable_ms": statistics.median(durable) * 1000,
        "worst_lag_ms": worst_lag * 1000,
        "booked_ms": statistics.median(booked) * 1000,
        "booked_ratio": statistics.median(booked) / statistics.median(plain),
        "booked_cpu_ms": booked_cpu / durable_steps * 1000,
        "booked_cpu_ratio": booked_cpu / plain_cpu if plain_cpu else 0.0,
    }


async def timed_steps(append, runs: int, steps: int) -> tuple[float, float, float]:
    """``runs`` tasks each appending ``steps`` steps to a run of its own, at once: per step, trio-thread CPU,
    process CPU and wall (ms)."""
    batches = [step(n) for n in range(steps)]
    tag = timed_steps.calls = getattr(timed_steps, "calls", 0) + 1

    async def one(run: int) -> None:
        for batch in batches:
            await append(f"d{tag}-{run}", batch)

    cpu0, proc0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for run in range(runs):
            nursery.start_soon(one, run)
    n = runs * steps
    return ((time.thread_time() - cpu0) / n * 1000, (time.process_time() - proc0) / n * 1000,
            (time.perf_counter() - wall0) / n * 1000)


async def compare(variants: dict, runs: int, steps: int, rounds: int) -> dict[str, float]:
    """Medians over ``rounds`` interleaved rounds (the order turns round each time) of each of ``variants``
    (name: append), and the ratios of the medians ``now`` ÷ ``before`` and ``now`` ÷ ``synced``."""
    got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            got[name].append(await timed_steps(variants[name], runs, steps))
    out: dict[str, float] = {}
    for name, rows in got.items():
        for i, measure in enumerate(("loop_cpu_ms", "cpu_ms", "wall_ms")):
            out[f"{name}_{measure}"] = statistics.median(row[i] for row in rows)
    for measure in ("loop_cpu_ms", "cpu_ms", "wall_ms"):
        for base in ("before", "synced"):
            if base in variants:
                out[f"ratio_{base}_{measure}"] = out[f"now_{measure}"] / out[f"{base}_{measure}"]
    return out


async def durability(state_dir: str, runs: int, steps: int, rounds: int) -> dict[str, float]:
    """SQLite: durable + grouped (agentd now) against NORMAL, one transaction per step (before)."""
    limiter = trio.CapacityLimiter(1)
    file = await trio.to_thread.run_sync(lambda: JournalFile(db_path(state_dir + "/before")), limiter=limiter)

    async def before(run_id: str, batch: list) -> None:
        await trio.to_thread.run_sync(lambda: file.append(run_id, batch, False), limiter=limiter)

    async def synced(run_id: str, batch: list) -> None:
        await trio.to_thread.run_sync(lambda: file.append(run_id, batch, True), limiter=limiter)

    try:
        async with open_journal(state_dir + "/now") as journal, open_journal(state_dir + "/every") as every:

            async def now(run_id: str, batch: list) -> None:
                await journal.append(run_id, batch, durable=True)

            out = await compare({"before": before, "synced": synced, "now": now}, runs, steps, rounds)
            out["groups_per_step"] = journal.writer.groups / journal.writer.batches

            def split(batch: list) -> tuple[list, list]:  # the reply, its request and usage; the outcome
                return [batch[0], batch[1], batch[3]], [batch[2]]

            async def loop_before(run_id: str, batch: list) -> None:
                for part in split(batch):
                    await before(run_id, part)

            async def loop_all_durable(run_id: str, batch: list) -> None:
                for part in split(batch):
                    await every.append(run_id, part, durable=True)

            async def loop_now(run_id: str, batch: list) -> None:
                reply, outcome = split(batch)
                await journal.append(run_id, reply, durable=True)
                await journal.append(run_id, outcome)

            groups, batches = journal.writer.groups, journal.writer.batches
            loop = await compare({"before": loop_before, "synced": loop_all_durable, "now": loop_now}, runs, steps,
                                 rounds)
            loop["groups_per_step"] = 2 * (journal.writer.groups - groups) / (journal.writer.batches - batches)
            out.update({f"loop_{k}": v for k, v in loop.items()})
    finally:
        await trio.to_thread.run_sync(file.close, limiter=limiter)
    return out


def durability_lines(results: dict[int, dict[str, float]], what: str, before: str, synced: str, now: str,
                     prefix: str = "") -> list[str]:
    results = {runs: {k[len(prefix):]: v for k, v in r.items() if k.startswith(prefix)} for runs, r in results.items()}
    lines = [f"| {what}: runs at once | trio-thread CPU per step: before / now (**now ÷ before**) | process CPU "
             "per step: before / now (**now ÷ before**) | now ÷ synced: trio thread / process | wall per step: "
             "before / synced / now | commits per step, now |",
             "|---|---|---|---|---|---|"]
    for runs, r in results.items():
        lines.append(f"| {runs} | {r['before_loop_cpu_ms']:.3f} / {r['now_loop_cpu_ms']:.3f} ms "
                     f"(**{r['ratio_before_loop_cpu_ms']:.2f}×**) | {r['before_cpu_ms']:.3f} / {r['now_cpu_ms']:.3f} "
                     f"ms (**{r['ratio_before_cpu_ms']:.2f}×**) | {r['ratio_synced_loop_cpu_ms']:.2f}× / "
                     f"{r['ratio_synced_cpu_ms']:.2f}× | {r['before_wall_ms']:.2f} / {r['synced_wall_ms']:.2f} / "
                     f"{r['now_wall_ms']:.2f} ms | {r['groups_per_step']:.2f} |")
    return [*lines, "", f"Before: {before}. Synced: {synced}. Now: {now}.", ""]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--durable-steps", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3, help="repeat and keep the best loop-CPU run")
    parser.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    parser.add_argument("--durability", action="store_true",
                        help="only the durability comparison (its own section in docs/benchmarks.md)")
    parser.add_argument("--concurrent", type=int, default=8, help="runs appending at once (--durability)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (--durability)")
    parser.add_argument("--baseline", default=None,
                        help="--durability: 'before' is this checkout's journal, each measurement a process")
    args = parser.parse_args()
    if args.durability:
        durable_main(args)
        return
    results = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            results.append(trio.run(bench, args.steps, args.durable_steps, tmp))
        print({k: round(v, 4) for k, v in results[-1].items()})
    best = min(results, key=lambda r: r["loop_cpu_ms"])
    if args.write:
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        lines = [
            SECTION, "",
            f"Command: `.venv/bin/python scripts/bench/journal.py --steps {args.steps} --write` (2-core VM, "
            f"{time.strftime('%Y-%m-%d %H:%M')} UTC, 1-minute load average {load} at the end: a shared "
            f"machine; best of {args.runs} runs by loop CPU). A step is one model reply with a tool call, the "
            "call's request and outcome, and the usage: 4 records, one transaction, `synchronous=NORMAL` "
            "(WAL). `loop CPU` is the trio thread's CPU time per step (`time.thread_time`): what a step's "
            "append costs the event loop; encoding and SQLite run on the journal's worker thread.", "",
            "| measure | value | target |",
            "|---|---|---|",
            f"| trio-thread CPU per step | **{best['loop_cpu_ms']:.3f} ms** | < 0.3 ms |",
            f"| floor: trio-thread CPU of a bare `to_thread.run_sync` no-op | {best['handoff_floor_ms']:.3f} ms | — |",
            f"| append wall time per step, median / p99 | {best['wall_ms']:.3f} / {best['p99_ms']:.3f} ms | — |",
            f"| throughput, one run | {best['steps_per_s']:.0f} steps/s ({best['records_per_s']:.0f} records/s) | — |",
            f"| durable step (`synchronous=FULL`, WAL fsync), median | {best['durable_ms']:.2f} ms | — |",
            f"| worst trio scheduling delay during appends (1 ms ticker) | {best['worst_lag_ms']:.2f} ms | — |",
            f"| step + budget books save (`--token-ceiling`, one more durable commit per reply), median wall; "
            f"ratio to the step alone | {best['booked_ms']:.2f} ms; **{best['booked_ratio']:.1f}x** | — |",
            f"| the same, trio-thread CPU per step; ratio | {best['booked_cpu_ms']:.3f} ms; "
            f"{best['booked_cpu_ratio']:.1f}x | — |",
            "",
            "The journal's own share of the trio thread's work is the difference between the first two rows; "
            "nearly all of a step's cost on the event loop is trio's thread hand-off itself. "
            "The wall-clock rows (p99, fsync, ticker delay, throughput) move with the machine's load and "
            "the disk; the CPU rows are the stable ones.",
            "",
        ]  # fmt: skip
        replace_section(SECTION, "\n".join(lines))


DURABILITY = "## Journal durability (SQLite)"

#: One measurement in a process of its own (argv: checkout, variant, runs, steps, state dir): prints the trio
#: thread's and the process's CPU per step and the wall per step, ms. ``before``/``loop_before`` use the
#: checkout's journal as it committed everything then (``durable=False``: ``synchronous=NORMAL``);
#: ``now``/``loop_now`` commit as the recorder does now (a reply with tool calls ``durable=True``);
#: ``unflushed`` commits as ``now`` but ``durable=False``: this checkout's code without the fsync. Every variant
#: but ``fresh`` first writes steps to a run of its own until the WAL has been checkpointed and started again
#: from its beginning (its header's checkpoint counter moved): a daemon's WAL after its first minutes, written
#: in place, not grown; ``fresh`` is ``now`` on a new file, whose WAL grows with every commit until then.
_PROBE = """
import sys, time
sys.path.insert(0, sys.argv[1])
import trio
from agentd.journal.records import ModelReply, ToolCallOutcome, ToolCallRequested, Usage
from agentd.journal.sqlite import open_journal

variant, runs, steps, state = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

def step(n):
    call = f"call-{n}"
    arguments = '{"query": "' + "q" * 80 + '"}'
    return [
        ModelReply(n, {"role": "assistant", "content": "Let me look that up. " * 4,
                       "tool_calls": [{"id": call, "name": "docs__search", "arguments": arguments}]}),
        ToolCallRequested(n, call, "docs__search", {"query": "q" * 80}),
        ToolCallOutcome(n, call, True, "result line " * 30),
        Usage(n, 1200 + 40 * n, 60),
    ]

def wal_restarts():
    try:
        with open(state + "/journal.sqlite3-wal", "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        return 0
    return int.from_bytes(head[12:16], "big") if len(head) == 16 else 0

async def main():
    batches = [step(n) for n in range(steps)]
    durable = variant.endswith("now") or variant == "fresh"
    async with open_journal(state) as journal:
        if variant != "fresh":  # the WAL in its steady state: checkpointed once, written again from its start
            n = 0
            while wal_restarts() == 0 and n < 20000:
                await journal.append("warm", batches[n % len(batches)])
                n += 1
        async def commit(run_id, batch):
            if variant.startswith("loop"):
                await journal.append(run_id, [batch[0], batch[1], batch[3]], durable=durable)
                await journal.append(run_id, [batch[2]])
            else:
                await journal.append(run_id, batch, durable=durable)

        async def one(run, todo):
            for batch in todo:
                await commit(f"{variant}-{run}", batch)

        async with trio.open_nursery() as nursery:  # warm-up: the worker thread, the statement cache
            for run in range(runs):
                nursery.start_soon(one, run, batches[:20])
        cpu0, proc0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for run in range(runs):
                nursery.start_soon(one, run, batches[20:])
        n = runs * (steps - 20)
        print((time.thread_time() - cpu0) / n * 1000, (time.process_time() - proc0) / n * 1000,
              (time.perf_counter() - wall0) / n * 1000)

trio.run(main)
"""


def durability_processes(baseline: str, runs: int, steps: int, rounds: int) -> dict[str, float]:
    """Each variant in processes of its own (``before`` from the ``baseline`` checkout, ``now`` from this one),
    interleaved over ``rounds`` rounds, the order turning round each time: medians and ratios now ÷ before."""
    import subprocess
    import sys

    here = str(Path(__file__).resolve().parents[2])
    where = {"before": baseline, "now": here, "unflushed": here, "fresh": here, "loop_before": baseline,
             "loop_now": here}
    got: dict[str, list[list[float]]] = {name: [] for name in where}
    names = list(where)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            with tempfile.TemporaryDirectory() as state:
                done = subprocess.run([sys.executable, "-c", _PROBE, where[name], name, str(runs), str(steps), state],
                                      cwd=where[name], capture_output=True, text=True, check=True, timeout=600)
            got[name].append([float(v) for v in done.stdout.split()])
    out: dict[str, float] = {}
    for name, rows in got.items():
        for i, measure in enumerate(("loop_cpu_ms", "cpu_ms", "wall_ms")):
            out[f"{name}_{measure}"] = statistics.median(row[i] for row in rows)
    for prefix in ("", "loop_"):
        for measure in ("loop_cpu_ms", "cpu_ms", "wall_ms"):
            out[f"{prefix}ratio_before_{measure}"] = out[f"{prefix}now_{measure}"] / out[f"{prefix}before_{measure}"]
    for measure in ("loop_cpu_ms", "cpu_ms", "wall_ms"):
        for name in ("unflushed", "fresh"):
            out[f"ratio_{name}_{measure}"] = out[f"{name}_{measure}"] / out[f"before_{measure}"]
    return out


def process_lines(results: dict[int, dict[str, float]], what: str, prefix: str = "") -> list[str]:
    unflushed = not prefix  # the same commits not flushed: what this checkout's code costs without the fsync
    lines = [f"| {what}: runs at once | trio-thread CPU per step: before / now (**now ÷ before**) | process CPU "
             "per step: before / now (**now ÷ before**) | wall per step: before / now |"
             + (" process CPU, now not flushed (÷ before) | process CPU, now on a fresh file (÷ before) |"
                if unflushed else ""),
             "|---|---|---|---|" + ("---|---|" if unflushed else "")]
    for runs, r in results.items():
        lines.append(f"| {runs} | {r[prefix + 'before_loop_cpu_ms']:.3f} / {r[prefix + 'now_loop_cpu_ms']:.3f} ms "
                     f"(**{r[prefix + 'ratio_before_loop_cpu_ms']:.2f}×**) | {r[prefix + 'before_cpu_ms']:.3f} / "
                     f"{r[prefix + 'now_cpu_ms']:.3f} ms (**{r[prefix + 'ratio_before_cpu_ms']:.2f}×**) | "
                     f"{r[prefix + 'before_wall_ms']:.2f} / {r[prefix + 'now_wall_ms']:.2f} ms |"
                     + (f" {r['unflushed_cpu_ms']:.3f} ms ({r['ratio_unflushed_cpu_ms']:.2f}×) | "
                        f"{r['fresh_cpu_ms']:.3f} ms ({r['ratio_fresh_cpu_ms']:.2f}×) |" if unflushed else ""))
    return [*lines, ""]


def durable_main(args: argparse.Namespace) -> None:
    results: dict[int, dict[str, float]] = {}
    if args.baseline:
        baseline_main(args)
        return
    for runs in (1, args.concurrent):
        with tempfile.TemporaryDirectory() as tmp:
            results[runs] = trio.run(durability, tmp, runs, args.steps // runs, args.rounds)
        print(runs, {k: round(v, 4) for k, v in results[runs].items()})
    if not args.write:
        return
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    lines = [
        DURABILITY, "",
        f"Command: `.venv/bin/python scripts/bench/journal.py --durability --steps {args.steps} --concurrent "
        f"{args.concurrent} --rounds {args.rounds} --write` (2-core VM, {time.strftime('%Y-%m-%d %H:%M')} UTC, "
        f"1-minute load average {load} at the end; medians of {args.rounds} interleaved rounds, ratios from the "
        f"same run). {args.steps} steps in all (4 records each), spread over the runs; the file is on the "
        "state directory's disk (here the VM's, whose fsync is what `now` waits for).", "",
        *durability_lines(results, "SQLite", "`synchronous=NORMAL`, one transaction per step, as before this "
                          "change", "the same with `synchronous=FULL` (WAL fsync), not grouped: what durability "
                          "alone costs", "`durable=True` as the recorder commits a step that asks for tool calls: "
                          "`synchronous=FULL`, batches of concurrent runs grouped"),
        "The same step as the loop commits it: two commits, the reply with its call's request and the usage "
        "(before the call is sent), then the call's outcome.", "",
        *durability_lines(results, "SQLite, as the loop commits", "both commits `synchronous=NORMAL`, ungrouped, "
                          "as before durability", "both commits `durable=True`, grouped: every record fsynced, "
                          "the policy before only what is acted on outside was", "the reply `durable=True`, the "
                          "outcome not (the recorder's policy: the next durable commit secures it), grouped",
                          prefix="loop_"),
        "Target: process CPU per step now ÷ before ≤ 1.1×.", "",
    ]
    replace_section(DURABILITY, "\n".join(lines))


def baseline_main(args: argparse.Namespace) -> None:
    results: dict[int, dict[str, float]] = {}
    with open("/proc/loadavg") as f:
        first = f.read().split()[0]
    for runs in (1, args.concurrent):
        results[runs] = durability_processes(args.baseline, runs, args.steps // runs, args.rounds)
        print(runs, {k: round(v, 4) for k, v in results[runs].items()}, flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print("load", first, load)
    if not args.write:
        return
    lines = [
        DURABILITY, "",
        f"Command: `.venv/bin/python scripts/bench/journal.py --durability --baseline DIR --steps {args.steps} "
        f"--concurrent {args.concurrent} --rounds {args.rounds} --write` (2-core VM, "
        f"{time.strftime('%Y-%m-%d %H:%M')} UTC, 1-minute load average {first} at the start, {load} at the end; medians of "
        f"{args.rounds} interleaved rounds, every measurement a process of its own, ratios from the same run). "
        f"`DIR` is a checkout of agentd before durability (`synchronous=NORMAL` for every commit); {args.steps} "
        "steps in all per measurement (4 records each, after 20 of warm-up per run), spread over the runs; the "
        "file is on the state directory's disk (here the VM's, whose fsync is what `now` waits for). Before "
        "measuring, each process writes steps to a run of its own until the WAL has been checkpointed and "
        "started again from its beginning, as a daemon's is after its first minutes: commits then write the "
        "WAL in place. `fresh` is `now` on a new file, whose WAL grows with every commit until its first "
        "checkpoint (a new state directory, or the first commits after every connection to the file closed).",
        "",
        *process_lines(results, "SQLite, one commit per step"),
        "Before: the checkout's journal, `durable=False` (`synchronous=NORMAL`), one transaction per step. Now: "
        "`durable=True` as the recorder commits a step that asks for tool calls (`synchronous=FULL`: the WAL's "
        "fdatasync before the commit returns), batches of concurrent runs grouped.", "",
        "The same step as the loop commits it: two commits, the reply with its call's request and the usage "
        "(before the call is sent), then the call's outcome.", "",
        *process_lines(results, "SQLite, as the loop commits", prefix="loop_"),
        "Before: both commits `synchronous=NORMAL`. Now: the reply `durable=True`, the outcome not (the "
        "recorder's policy: the next durable commit secures it), grouped.", "",
        "Target: process CPU per step now ÷ before ≤ 1.1×.", "",
    ]
    replace_section(DURABILITY, "\n".join(lines))


if __name__ == "__main__":
    main()
