"""A busy reactive daemon: many subscribed URIs on one server, a steady stream of updates spread over them.

Setup as in ``reactive.py``: the official Python SDK test peer (its own process, legacy era with
``resources/subscribe``), the scripted gateway in this process answering every request at once, and
``agentd.modes.entry.daemon_mode`` in this process in ``--mode reactive`` with the default debounce
(250 ms) and the default 4 concurrent wakes, subscribed to ``--uris`` counters. The wake-rate governor's
caps (60 wakes a minute by default) are raised out of the way: this measures the daemon, not its cap.

For ``--seconds``, updates are sent at a steady ``--rate`` per second (each to a URI chosen uniformly at
random, at most 8 side-door POSTs in flight); then the daemon is given ``--settle`` seconds to read every
URI's final state. Reported: updates sent and the rate reached, wakes and wakes/s, the coalescing ratio
(updates per wake, and per URI read: one wake of a saturated daemon reads several URIs), the update→model latency (from just before an update's side-door POST to the first
model request that read that update's value or a later one; median and p99), this process's CPU per wake
(agentd plus the in-process gateway and side-door client; the SDK server is another process), and whether
every URI's last wake read its final value.

    .venv/bin/python scripts/bench/busy.py [--uris 1000] [--rate 200] [--seconds 20] [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_doc import replace_section  # noqa: E402  (scripts/bench is on sys.path when run)

from agentd import defaults  # noqa: E402
from agentd.config.model import Config, IntelligenceConfig, McpServerConfig, ModesConfig  # noqa: E402
from agentd.modes.entry import daemon_mode  # noqa: E402
from agentd.supervisor.wiring import open_root_supervisor  # noqa: E402
from agentd.telemetry.events import EventLog, RateLimiter  # noqa: E402
from tests.peers import launch  # noqa: E402
from tests.peers.gateway import RecordedRequest, scripted_gateway, text  # noqa: E402

SECTION = "## Busy reactive daemon"
SIDE_DOOR = 8  # side-door POSTs in flight (and connections)
_CONTENT = re.compile(r'<resource uri="([^"]+)"[^>]*>\n(.*?)\n</resource>', re.S)


class Busy:
    def __init__(self) -> None:
        self.armed = 0
        self.wake_ends = 0
        self.runs = 0  # model requests (one per wake with this gateway)
        self.reads: dict[str, list[tuple[float, int]]] = {}  # uri -> (perf_counter, value read) per wake

    def sink(self, line: dict[str, Any]) -> None:
        event = line["event"]
        if event == "trigger.armed":
            self.armed += 1
        elif event == "run.end" and line.get("trigger") == "wake":
            self.wake_ends += 1

    def reply(self, request: RecordedRequest) -> dict[str, Any]:
        now = time.perf_counter()
        users = [m for m in request.messages if m.get("role") == "user"]
        self.runs += 1
        for match in _CONTENT.finditer(str(users[-1]["content"]) if users else ""):  # a batched wake reads many
            if match.group(2).strip().isdigit():
                self.reads.setdefault(match.group(1), []).append((now, int(match.group(2).strip())))
        return text("ok")

    def wakes(self) -> int:
        return self.runs

    def uri_reads(self) -> int:
        return sum(len(v) for v in self.reads.values())


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def _wait(predicate: Any, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.05)
        return True
    return False


@contextlib.contextmanager
def _profiled(prefix: str | None, phase: str) -> Iterator[None]:
    """cProfile (CPU time) this phase into ``<prefix>.<phase>.prof`` (``--profile``; off by default)."""
    if not prefix:
        yield
        return
    import cProfile

    profile = cProfile.Profile(time.process_time)  # CPU time: wall time on a loaded machine is noise
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        profile.dump_stats(f"{prefix}.{phase}.prof")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    busy = Busy()
    uris = [f"test://busy/{i}" for i in range(args.uris)]
    rng = random.Random(args.seed)
    async with scripted_gateway(default=busy.reply) as gw, launch.peer_server(launch.sdk_server_argv()) as peer:
        cfg = Config(instruction="Report the counter.", intelligence=IntelligenceConfig(endpoints=(gw.url,)), modes=ModesConfig(subscribe=tuple(uris), max_wakes_per_minute=10**9, max_wakes_per_uri_per_minute=10**9), mode="reactive",
                     mcp=(McpServerConfig("srv", peer.url, connect_timeout=30.0, call_timeout=30.0),),
                     )
        assert cfg.modes.debounce == defaults.DEBOUNCE
        assert cfg.modes.max_concurrent_wakes == defaults.MAX_CONCURRENT_WAKES
        # Every line counted: the log's rate limit (50 a second per event) would hide arms of a fast start.
        log = EventLog(sink=busy.sink, level="info", run_id="busy", limiter=RateLimiter(limit=0))
        drain = trio.Event()
        # The side door's own client: few connections (httpcore's pool costs CPU per request in proportion to
        # the connections it keeps, and this process's CPU is what the CPU rows measure).
        limits = httpx.Limits(max_connections=SIDE_DOOR, max_keepalive_connections=SIDE_DOOR)
        async with (
            httpx.AsyncClient(limits=limits, timeout=30) as side,
            open_root_supervisor(cfg, log=log, env={}, run_id=log.run_id) as supervisor,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(functools.partial(daemon_mode, cfg, log, nursery, supervisor=supervisor, drain=drain))
            arm_start, arm_cpu = time.perf_counter(), time.process_time()
            with _profiled(args.profile, "arm"):
                if not await _wait(lambda: busy.armed >= len(uris), 300):
                    raise SystemExit(f"only {busy.armed} of {len(uris)} URIs armed")
            arm_s, arm_cpu = time.perf_counter() - arm_start, time.process_time() - arm_cpu
            await trio.sleep(1.0)
            busy.reads.clear()
            bump_url = peer.origin + "/_test/bump"
            sent: list[tuple[float, str, int]] = []  # (perf_counter before the POST, uri, value it made)
            final: dict[str, int] = {}
            limiter = trio.CapacityLimiter(SIDE_DOOR)

            async def bump(uri: str) -> None:
                async with limiter:
                    start = time.perf_counter()
                    response = await side.post(bump_url, params={"uri": uri})
                    response.raise_for_status()
                    value = int(response.json()["value"])
                    sent.append((start, uri, value))
                    final[uri] = max(final.get(uri, 0), value)

            total = int(args.rate * args.seconds)
            cpu_start, wall_start = time.process_time(), trio.current_time()
            peer_cpu_start = proc_cpu(peer.pid)
            wakes_before, reads_before = busy.wakes(), busy.uri_reads()
            with _profiled(args.profile, "steady"):
                async with trio.open_nursery() as senders:
                    for i in range(total):
                        await trio.sleep_until(wall_start + i / args.rate)
                        senders.start_soon(bump, rng.choice(uris))
            send_s = trio.current_time() - wall_start

            def settled() -> bool:
                return all(busy.reads.get(u) and busy.reads[u][-1][1] >= v for u, v in final.items())

            settled_ok = await _wait(settled, args.settle)
            await trio.sleep(max(0.5, cfg.modes.debounce * 2))  # quiet: a late wake would show up here
            cpu = time.process_time() - cpu_start
            peer_cpu = proc_cpu(peer.pid) - peer_cpu_start
            wall = trio.current_time() - wall_start
            wakes = busy.wakes() - wakes_before
            uri_reads = busy.uri_reads() - reads_before
            drain.set()
    latencies = []
    for start, uri, value in sent:
        after = next((t for t, read in busy.reads.get(uri, []) if read >= value), None)
        if after is not None:
            latencies.append((after - start) * 1000)
    missed = sorted(u for u, v in final.items() if not busy.reads.get(u) or busy.reads[u][-1][1] != v)
    return {
        "uris": args.uris, "rate": args.rate, "seconds": args.seconds, "arm_s": arm_s,
        "arm_cpu_per_uri": arm_cpu * 1000 / max(len(uris), 1),
        "updates": len(sent), "send_s": send_s, "rate_reached": len(sent) / send_s,
        "touched": len(final), "wakes": wakes, "wakes_per_s": wakes / wall, "wall_s": wall,
        "coalescing": len(sent) / max(wakes, 1), "uri_reads": uri_reads,
        "per_read": len(sent) / max(uri_reads, 1), "uris_per_wake": uri_reads / max(wakes, 1),
        "latency_median": statistics.median(latencies) if latencies else float("nan"),
        "latency_p99": pct(latencies, 0.99), "latency_max": max(latencies, default=float("nan")),
        "unanswered": len(sent) - len(latencies),
        "cpu_per_wake": cpu * 1000 / max(wakes, 1), "cpu_per_update": cpu * 1000 / max(len(sent), 1),
        "peer_cpu_per_update": peer_cpu * 1000 / max(len(sent), 1), "cpu_share": cpu / max(wall, 1e-9),
        "peer_share": peer_cpu / max(wall, 1e-9),
        "settled": settled_ok, "settle": args.settle, "missed": missed,
        "load": os.getloadavg()[0], "cpus": os.cpu_count(),
    }


def render(r: dict[str, Any], command: str) -> str:
    if r["settled"] and not r["missed"]:
        last = "yes"
    elif r["settled"]:
        last = "**NO**: " + ", ".join(r["missed"][:10])
    else:  # a saturated daemon: the final reads were still queued when the settle time ran out
        last = (f"not settled within {r['settle']:g} s ({len(r['missed'])} of {r['touched']} URIs still behind: the "
                "daemon was saturated; the test checks it at a scale that settles)")
    return "\n".join([
        SECTION,
        "",
        f"Command: `{command}` (2-core VM; load average {r['load']:.1f} at the end; **to be re-measured on a quiet "
        "machine**: the wall-clock rows move with load, the CPU rows and the correctness row do not).",
        "",
        f"{r['uris']} URIs subscribed on one official-SDK server (armed in {r['arm_s']:.1f} s), updates at a steady "
        f"{r['rate']}/s for {r['seconds']} s, each to a URI chosen at random; default debounce "
        f"({defaults.DEBOUNCE * 1000:g} ms) and {defaults.MAX_CONCURRENT_WAKES} concurrent wakes; the wake-rate "
        "caps raised out of the way.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| arming: wall / CPU of this process per URI (ms; read, subscribe, read; 8 URIs at a time) | "
        f"{r['arm_s'] * 1000 / r['uris']:.1f} / {r['arm_cpu_per_uri']:.2f} |",
        f"| updates sent (rate reached) | {r['updates']} ({r['rate_reached']:.0f}/s), {r['touched']} URIs touched |",
        f"| wakes (agent runs), wakes/s | {r['wakes']}, {r['wakes_per_s']:.1f}/s |",
        f"| URIs read per wake (a saturated daemon batches) | {r['uris_per_wake']:.2f} |",
        f"| coalescing ratio: updates per wake / per URI read | {r['coalescing']:.2f} / {r['per_read']:.2f} |",
        f"| update→model latency, median / p99 / max (ms) | {r['latency_median']:.1f} / {r['latency_p99']:.1f} / "
        f"{r['latency_max']:.1f} |",
        f"| CPU of this process per wake / per update (ms) | {r['cpu_per_wake']:.2f} / {r['cpu_per_update']:.2f} |",
        f"| CPU of the SDK server process per update (ms: side-door bump, notification, reads) | "
        f"{r['peer_cpu_per_update']:.2f} |",
        f"| cores used over the run: this process / the SDK server | {r['cpu_share']:.2f} / {r['peer_share']:.2f} |",
        f"| updates whose value no wake read (yet) | {r['unanswered']} |",
        f"| every URI's last wake read its final value | {last} |",
        "",
        "`tests/modes/test_busy_last_state.py` checks the last row at a smaller scale (real SDK server, real "
        "sockets) on every test run.",
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uris", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--profile", metavar="PREFIX", help="cProfile arming and the steady state into PREFIX.*.prof")
    args = parser.parse_args()
    result = trio.run(run, args)
    command = ".venv/bin/python scripts/bench/busy.py" + "".join(
        f" --{name} {getattr(args, name):g}" for name in ("uris", "rate", "seconds")
        if getattr(args, name) != parser.get_default(name)) + " --write"
    section = render(result, command)
    print(section)
    print(result, file=sys.stderr)
    if args.write:
        replace_section(SECTION, section)


if __name__ == "__main__":
    main()
