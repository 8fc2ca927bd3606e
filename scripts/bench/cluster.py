"""Cluster: work claims per second and claim-to-start latency with 1, 2 and 3 members, failover time after a
SIGKILL, and the journal's per-step cost on PostgreSQL against SQLite.

    .venv/bin/python scripts/bench/cluster.py [--items 300] [--steps 1000] [--failovers 5] [--ttl 2] [--write]

Starts a throwaway PostgreSQL (tests/postgres.py: the installed binaries, ``fsync=off``) and measures, in one
process (each member is an agentd.cluster.member.Member with its own connections and worker threads, so the
members share this process's CPU: a floor on what separate hosts reach):

- claims/s: ``--items`` work items enqueued at once, members with capacity 4 each run a no-op per item;
  items finished per second from the first enqueue to the last finish;
- claim-to-start latency: one item enqueued at a time into idle members (the NOTIFY wake-up path): time from
  the enqueue's commit to the item's run starting, median and p95;
- failover after SIGKILL: a member in a process of its own (this script with ``--member``) claims an item
  whose run never ends; once it holds the lease another member joins (in this process) and the first one is
  SIGKILLed; the time from the kill to the item's run starting on the survivor, ``--failovers`` times with
  leases of ``--ttl`` seconds. Leases are renewed every third of the TTL, so the expected value lies between
  two thirds of the TTL and the TTL plus the claim poll (1 s, agentd.cluster.member.POLL_INTERVAL);
- per-step journal cost: ``--steps`` steps (4 records, one transaction) appended to one run on each backend:
  trio-thread CPU per step and wall time per step (median). The PostgreSQL step is fenced (the lease check
  is in the same transaction), as a claimed run's steps are.

Ratios measured in one run (PG ÷ SQLite; 3 members ÷ 1) are the stable figures; absolute numbers move with
the machine's load.

``--durability`` measures instead, on a server with ``fsync=on`` (so a synchronous commit waits for the disk):

- a claimed run's step committed as agentd commits it now (fenced, ``durable=True``: ``synchronous_commit=on``,
  batches of concurrent runs grouped, agentd.journal.group) against the way it was committed before
  (fenced, ``synchronous_commit=off``, one transaction per step), with 1 and ``--concurrent`` runs appending
  at once: CPU per step of the trio thread and of the process, wall per step, and the ratios now ÷ before
  (medians over ``--rounds`` interleaved rounds; scripts/bench/journal.py ``compare``);
- claims per second with 1 and 2 members (as above, every claim and finish a synchronous commit).

``--claims ROUNDS [--previous DIR]`` measures only claims per second with 1 and 2 members on a server with
``fsync=on``, each measurement in a process of its own (this checkout's, and with ``--previous`` that of
another checkout DIR, say the tree before a change to the claim path), interleaved over ``ROUNDS`` rounds
(the order alternating), medians and the ratio now ÷ previous (section "Cluster claims").
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_doc import replace_section
from journal import compare, durability_lines, step

from agentd.cluster.member import Member
from agentd.cluster.store import FencedJournal, append_in, check_fence, open_database, open_pg_journal
from agentd.cluster.work import Queue, WorkItem, enqueue
from agentd.journal.records import RunStarted
from agentd.journal.sqlite import open_journal
from agentd.telemetry.events import EventLog
from tests.postgres import PASSWORD, start_server

SECTION = "## Cluster"


async def _members(stack: AsyncExitStack, dsn: str, n: int, execute, nursery: trio.Nursery, *, ttl: float = 30,
                   name: str = "m") -> None:
    log = EventLog(sink=lambda line: None)
    for i in range(n):
        store = await stack.enter_async_context(open_pg_journal(dsn, PASSWORD))
        listen = await open_database(dsn, PASSWORD, "listen")
        stack.push_async_callback(listen.aclose)
        member = Member(Queue(store, f"{name}{i}", None, 4), execute, log, ttl=ttl, listen_db=listen)
        await nursery.start(member.serve)


async def throughput(dsn: str, members: int, items: int) -> float:
    done = trio.Event()
    finished = 0

    async def execute(item: WorkItem, journal: FencedJournal) -> None:
        nonlocal finished
        finished += 1
        if finished == items:
            done.set()

    async with AsyncExitStack() as stack:
        producer = await stack.enter_async_context(open_pg_journal(dsn, PASSWORD))
        async with trio.open_nursery() as nursery:
            await _members(stack, dsn, members, execute, nursery)
            t0 = time.perf_counter()
            for i in range(items):
                await enqueue(producer, f"t{members}-{i}", "bench", {})
            await done.wait()
            elapsed = time.perf_counter() - t0
            nursery.cancel_scope.cancel()
    return items / elapsed


async def latency(dsn: str, members: int, samples: int) -> list[float]:
    started: dict[str, float] = {}
    arrived = trio.Event()

    async def execute(item: WorkItem, journal: FencedJournal) -> None:
        started[item.work_id] = time.perf_counter()
        arrived.set()

    out = []
    async with AsyncExitStack() as stack:
        producer = await stack.enter_async_context(open_pg_journal(dsn, PASSWORD))
        async with trio.open_nursery() as nursery:
            await _members(stack, dsn, members, execute, nursery)
            await trio.sleep(0.5)
            for i in range(samples):
                arrived = trio.Event()
                t0 = time.perf_counter()
                await enqueue(producer, f"l{members}-{i}", "bench", {})
                t1 = time.perf_counter()
                await arrived.wait()
                out.append(started[f"l{members}-{i}"] - t1 + (t1 - t0) / 2)
                await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
    return out


async def serve_victim(dsn: str, ttl: float) -> None:
    """``--member``: one member whose runs never end, saying ``JOINED`` and ``CLAIMED <id>`` on stdout."""

    async def execute(item: WorkItem, journal: FencedJournal) -> None:
        print(f"CLAIMED {item.work_id}", flush=True)
        await trio.sleep_forever()

    async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
        await _members(stack, dsn, 1, execute, nursery, ttl=ttl, name=f"victim-{os.getpid()}-")
        print("JOINED", flush=True)


async def _line(stream: trio.abc.ReceiveStream, wanted: str, buffer: bytearray) -> None:
    with trio.fail_after(60):
        while wanted.encode() + b"\n" not in buffer:
            chunk = await stream.receive_some(4096)
            if not chunk:
                raise RuntimeError(f"the member exited before saying {wanted!r}")
            buffer.extend(chunk)


async def failover(dsn: str, ttl: float, samples: int) -> list[float]:
    out = []
    for i in range(samples):
        started = trio.Event()
        resumed_at = 0.0

        async def execute(item: WorkItem, journal: FencedJournal) -> None:
            nonlocal resumed_at
            resumed_at = time.perf_counter()
            started.set()

        victim = await trio.lowlevel.open_process(
            [sys.executable, __file__, "--member", dsn, "--ttl", str(ttl)], stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL, cwd=str(Path(__file__).resolve().parents[2]))
        assert victim.stdout is not None
        seen = bytearray()
        try:
            await _line(victim.stdout, "JOINED", seen)
            async with AsyncExitStack() as stack:
                producer = await stack.enter_async_context(open_pg_journal(dsn, PASSWORD))
                await enqueue(producer, f"f-{i}", "bench", {})
                await _line(victim.stdout, f"CLAIMED f-{i}", seen)
                async with trio.open_nursery() as nursery:
                    await _members(stack, dsn, 1, execute, nursery, ttl=ttl, name=f"survivor-{i}-")
                    victim.send_signal(signal.SIGKILL)
                    killed_at = time.perf_counter()
                    with trio.fail_after(ttl + 30):
                        await started.wait()
                    out.append(resumed_at - killed_at)
                    nursery.cancel_scope.cancel()
        finally:
            if victim.returncode is None:
                victim.kill()
            with trio.move_on_after(10):
                await victim.wait()
    return out


async def per_step(dsn: str, steps: int) -> dict[str, float]:
    batches = [step(n) for n in range(steps)]
    result: dict[str, float] = {}

    async def measure(name: str, append) -> None:
        walls = []
        cpu0 = time.thread_time()
        for batch in batches:
            t0 = time.perf_counter()
            await append(batch)
            walls.append(time.perf_counter() - t0)
        result[f"{name}_cpu_ms"] = (time.thread_time() - cpu0) / steps * 1000
        result[f"{name}_wall_ms"] = statistics.median(walls) * 1000

    with tempfile.TemporaryDirectory() as tmp:
        async with open_journal(tmp) as journal:
            await journal.append("bench", [RunStarted("d", "bench")])
            await measure("sqlite", lambda b: journal.append("bench", b))
    async with open_pg_journal(dsn, PASSWORD) as pg:
        lease = await pg.claim("bench", "bench", ttl=3600)
        assert lease is not None
        fenced = FencedJournal(pg, lease)
        await fenced.append("bench", [RunStarted("d", "bench")])
        await measure("pg", lambda b: fenced.append("bench", b))
    return result


async def durability(dsn: str, runs: int, steps: int, rounds: int) -> dict[str, float]:
    """PostgreSQL: fenced, durable and grouped (agentd now) against fenced with ``synchronous_commit=off``, one
    transaction per step (before)."""
    async with open_pg_journal(dsn, PASSWORD) as old, open_pg_journal(dsn, PASSWORD) as pg:
        leases = {}

        async def lease(store, run_id: str):
            if run_id not in leases:
                leases[run_id] = await store.claim(run_id, "bench", ttl=3600)
            return leases[run_id]

        def ungrouped(sync: str):
            async def append(run_id: str, batch: list) -> None:
                held, now = await lease(old, run_id), time.time()

                def work(conn) -> int:
                    with conn.transaction():
                        conn.execute(f"SET LOCAL synchronous_commit = {sync}")
                        check_fence(conn, held)
                        return append_in(conn, run_id, batch, now)

                await old.db.call(work, "append")

            return append

        async def now(run_id: str, batch: list) -> None:
            await FencedJournal(pg, await lease(pg, run_id)).append(run_id, batch, durable=True)

        out = await compare({"before": ungrouped("off"), "synced": ungrouped("on"), "now": now}, runs, steps, rounds)
        out["groups_per_step"] = pg.writer.groups / pg.writer.batches
    return out


async def durability_bench(dsn_of, steps: int, concurrent: int, rounds: int, items: int
                           ) -> tuple[dict[int, dict[str, float]], dict[int, float]]:
    steps_out = {runs: await durability(dsn_of(), runs, steps // runs, rounds) for runs in (1, concurrent)}
    claims = {n: await throughput(dsn_of(), n, items) for n in (1, 2)}
    return steps_out, claims


DURABILITY = "## Cluster durability (PostgreSQL)"


def durable_main(args: argparse.Namespace) -> None:
    server = start_server(settings=("fsync=on",))
    try:
        steps, claims = trio.run(durability_bench, lambda: server.dsn(server.new_database()), args.steps,
                                 args.concurrent, args.rounds, args.items)
    finally:
        server.close()
    for runs, r in steps.items():
        print(runs, {k: round(v, 4) for k, v in r.items()})
    print("claims/s", {n: round(v) for n, v in claims.items()})
    if not args.write:
        return
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    lines = [
        DURABILITY, "",
        f"Command: `.venv/bin/python scripts/bench/cluster.py --durability --steps {args.steps} --concurrent "
        f"{args.concurrent} --rounds {args.rounds} --items {args.items} --write` (2-core VM, "
        f"{time.strftime('%Y-%m-%d %H:%M')} UTC, 1-minute load average {load} at the end; medians of "
        f"{args.rounds} interleaved rounds, ratios from the same run). A throwaway PostgreSQL on loopback with "
        f"`fsync=on`; {args.steps} steps in all (4 records each), spread over the runs, each run fenced on its "
        "own lease.", "",
        *durability_lines(steps, "PostgreSQL", "fenced, `synchronous_commit=off`, one transaction per step, as "
                          "before this change", "the same with `synchronous_commit=on`, not grouped: what "
                          "durability alone costs", "fenced, `durable=True` as the recorder commits a step that "
                          "asks for tool calls: `synchronous_commit=on`, batches of concurrent runs grouped"),
        "Target: CPU per step now ÷ before ≤ 1.2×.", "",
        "| members (one process, capacity 4 each, no-op runs) | claims/s |",
        "|---|---|",
        *[f"| {n} | {v:.0f} |" for n, v in claims.items()],
        "",
        "Target: ≥ 250 claims/s with 2 members on 2 cores.", "",
    ]  # fmt: skip
    replace_section(DURABILITY, "\n".join(lines))


async def bench(dsn_of, items: int, steps: int, samples: int, failovers: int, ttl: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in (1, 2, 3):
        out[f"claims_per_s_{n}"] = await throughput(dsn_of(), n, items)
        lat = sorted(await latency(dsn_of(), n, samples))
        out[f"latency_median_ms_{n}"] = statistics.median(lat) * 1000
        out[f"latency_p95_ms_{n}"] = lat[int(len(lat) * 0.95)] * 1000
    if failovers:
        times = sorted(await failover(dsn_of(), ttl, failovers))
        out["failover_median_s"] = statistics.median(times)
        out["failover_max_s"] = times[-1]
        out["failover_min_s"] = times[0]
    out.update(await per_step(dsn_of(), steps))
    return out


CLAIMS = "## Cluster claims"
#: Measures one checkout's claims/s (argv: its directory, DSN, members, items, mode) and prints it. ``trickle``:
#: :func:`throughput` (the items enqueued one by one while the members claim); ``queued``: every item enqueued
#: before the members start, timed from their start to the last finish (the claim path alone).
_CLAIMS_PROBE = """
import sys, time, trio
from contextlib import AsyncExitStack
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/scripts/bench"]
import cluster
from cluster import PASSWORD, _members, enqueue, open_pg_journal
dsn, members, items, mode = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

async def queued():
    done, finished = trio.Event(), 0
    async def execute(item, journal):
        nonlocal finished
        finished += 1
        if finished == items:
            done.set()
    async with AsyncExitStack() as stack:
        producer = await stack.enter_async_context(open_pg_journal(dsn, PASSWORD))
        for i in range(items):
            await enqueue(producer, f"q{members}-{i}", "bench", {})
        async with trio.open_nursery() as nursery:
            t0 = time.perf_counter()
            await _members(stack, dsn, members, execute, nursery)
            await done.wait()
            elapsed = time.perf_counter() - t0
            nursery.cancel_scope.cancel()
    return items / elapsed

print(trio.run(cluster.throughput, dsn, members, items) if mode == "trickle" else trio.run(queued))
"""
MODES = ("trickle", "queued")


def claims_main(args: argparse.Namespace) -> None:
    here = str(Path(__file__).resolve().parents[2])
    checkouts = {"now": here, **({"previous": args.previous} if args.previous else {})}
    keys = [(mode, n) for mode in MODES for n in (1, 2)]
    out: dict[str, dict[tuple[str, int], list[float]]] = {name: {key: [] for key in keys} for name in checkouts}
    server = start_server(settings=("fsync=on",))
    try:
        for r in range(args.claims):
            order = list(checkouts.items()) if r % 2 == 0 else list(reversed(checkouts.items()))
            for name, where in order:
                for mode, n in keys:
                    done = subprocess.run([sys.executable, "-c", _CLAIMS_PROBE, where, server.dsn(server.new_database()),
                                           str(n), str(args.items), mode], cwd=where, capture_output=True, text=True,
                                          check=True, timeout=600)
                    out[name][mode, n].append(float(done.stdout.split()[-1]))
                    print(name, mode, n, f"{out[name][mode, n][-1]:.0f}/s", flush=True)
    finally:
        server.close()
    load = os.getloadavg()[0]
    med = {name: {key: statistics.median(v) for key, v in per.items()} for name, per in out.items()}
    rows = [f"| {'enqueued while claiming' if mode == 'trickle' else 'all queued first'} | {n} | "
            f"{med['now'][mode, n]:.0f} | "
            + (f"{med['previous'][mode, n]:.0f} | {med['now'][mode, n] / med['previous'][mode, n]:.2f}× |"
               if "previous" in med else "— | — |") for mode, n in keys]
    section = "\n".join([
        CLAIMS, "",
        f"Command: `.venv/bin/python scripts/bench/cluster.py --claims {args.claims} --items {args.items}"
        f"{' --previous DIR' if args.previous else ''} --write` (2-core VM, {time.strftime('%Y-%m-%d %H:%M')} UTC, "
        f"1-minute load average {load:.1f} at the end"
        + (": a loaded machine, the absolute rates are low; the ratio is the figure" if load > 2 else "")
        + f"). A throwaway PostgreSQL with `fsync=on`; {args.items} no-op items, each enqueued as a synchronous "
        "commit of its own from the members' process, either while the members claim (from the first enqueue "
        "to the last finish: the figure of the sections above) or all before the members start (from their "
        "start to the last finish: the claim path alone); members of capacity 4 in one process; each "
        f"measurement a process of its own, the checkouts interleaved, medians of {args.claims}.",
        "",
        "| items | members | claims/s now (median) | previous (median) | now ÷ previous |",
        "|---|---|---|---|---|",
        *rows, "",
        "Each measurement, claims/s: " + "; ".join(f"{name} {mode} {n}: " + ", ".join(f"{v:.0f}" for v in vals)
                                                   for name, per in out.items() for (mode, n), vals in per.items())
        + ".",
        "",
    ])
    print(section)
    if args.write:
        replace_section(CLAIMS, section)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--failovers", type=int, default=5, help="SIGKILL failovers to time (0: skip)")
    parser.add_argument("--ttl", type=float, default=2.0, help="lease TTL of the failover members, seconds")
    parser.add_argument("--member", metavar="DSN", help=argparse.SUPPRESS)  # the failover's victim process
    parser.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    parser.add_argument("--durability", action="store_true",
                        help="only the durability comparison and claims/s (their own section in docs/benchmarks.md)")
    parser.add_argument("--concurrent", type=int, default=8, help="runs appending at once (--durability)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (--durability)")
    parser.add_argument("--claims", type=int, default=0, metavar="ROUNDS",
                        help="only claims/s, each measurement its own process, ROUNDS interleaved rounds")
    parser.add_argument("--previous", default=None, help="another checkout to interleave with (--claims)")
    args = parser.parse_args()
    if args.claims:
        claims_main(args)
        return
    if args.member:
        trio.run(serve_victim, args.member, args.ttl)
        return
    if args.durability:
        durable_main(args)
        return
    server = start_server()
    try:
        cpu0 = time.process_time()
        r = trio.run(bench, lambda: server.dsn(server.new_database()), args.items, args.steps, args.samples,
                     args.failovers, args.ttl)
        cpu = time.process_time() - cpu0
    finally:
        server.close()
    print({k: round(v, 3) for k, v in r.items()}, f"process CPU {cpu:.1f}s")
    if not args.write:
        return
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    lines = [
        SECTION, "",
        f"Command: `.venv/bin/python scripts/bench/cluster.py --items {args.items} --steps {args.steps} "
        f"--failovers {args.failovers} --ttl {args.ttl:g} --write` "
        f"(2-core VM, {time.strftime('%Y-%m-%d %H:%M')} UTC, 1-minute load average {load} at the end; "
        "**to be re-measured on a quiet machine**). A throwaway PostgreSQL 15 on loopback (`fsync=off`); the "
        "members are in one process (their own connections and worker threads, one CPU budget), so these are "
        "floors for members on separate hosts.", "",
        "| members | claims/s (no-op runs, capacity 4 each) | claim-to-start latency, median / p95 |",
        "|---|---|---|",
        *[f"| {n} | {r[f'claims_per_s_{n}']:.0f} | {r[f'latency_median_ms_{n}']:.2f} / "
          f"{r[f'latency_p95_ms_{n}']:.2f} ms |" for n in (1, 2, 3)],
        "",
        *([f"Failover after SIGKILL (a member process killed while its run holds the lease; the survivor "
           f"claims at the lease's expiry): median {r['failover_median_s']:.2f} s, min {r['failover_min_s']:.2f} "
           f"s, max {r['failover_max_s']:.2f} s over {args.failovers} kills with `--cluster-lease-ttl "
           f"{args.ttl:g}s` (expected between {args.ttl * 2 / 3:.2f} s and {args.ttl + 1:.2f} s: the lease's "
           "rest plus the claim poll).", ""] if args.failovers else []),
        "| journal step (4 records, one transaction) | trio-thread CPU per step | wall per step, median |",
        "|---|---|---|",
        f"| SQLite (`synchronous=NORMAL`) | {r['sqlite_cpu_ms']:.3f} ms | {r['sqlite_wall_ms']:.3f} ms |",
        f"| PostgreSQL, fenced (`synchronous_commit=off`) | {r['pg_cpu_ms']:.3f} ms | {r['pg_wall_ms']:.3f} ms |",
        f"| ratio PG ÷ SQLite | {r['pg_cpu_ms'] / r['sqlite_cpu_ms']:.2f}× | "
        f"{r['pg_wall_ms'] / r['sqlite_wall_ms']:.2f}× |",
        "",
    ]  # fmt: skip
    replace_section(SECTION, "\n".join(lines))


if __name__ == "__main__":
    main()
