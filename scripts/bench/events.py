"""MCP events as wakes: an event's wake latency against a resource update's, and memory per event subscription.

Setup: the events-extension test peer (tests/peers/servers/events_server.py, a separate process on the 2026-07-28
wire, ``--push``: ``ticket.created`` offered by ``events/stream``), the scripted gateway in this process answering
every request at once, and ``agentd.modes.entry.daemon_mode`` in this process in ``--mode reactive``, subscribed
to the peer's ``test://counter`` (``--subscribe``, pushed on ``subscriptions/listen``) and to ``ticket.created``
(``--on-event``).

Latency: ``--wakes`` sequential wakes, alternating a resource update (the side-door bump, which sends
``notifications/resources/updated``) and an event (the side-door emit, which the open ``events/stream`` carries).
Each is timed from just before its side-door POST to the gateway receiving the wake's first model request. The
ratio is the event's median over the update's (target ≤ 1.2: the events path adds no round trip; the resource path
reads the resource again after its notification, the event path carries the occurrence itself). ``--delivery
poll`` times the poll path instead (bounded by the poll interval, not by agentd: for reference only).

Memory: a daemon armed with ``--subscriptions`` event subscriptions (poll delivery, each with its own arguments so
each is its own subscription; the peer suggests a 300 s interval, so after its first poll each one sleeps) against
one with a single subscription; the difference of Python heap in use (tracemalloc) per subscription, and of the
process's RSS. Target ≤ 64 KiB per subscription.

    .venv/bin/python scripts/bench/events.py [--wakes 200] [--subscriptions 1000] [--write] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_doc import replace_section  # noqa: E402  (scripts/bench is on sys.path when run)

from agentd.config.model import (  # noqa: E402
    Config,
    EventSubscriptionConfig,
    IntelligenceConfig,
    McpServerConfig,
    ModesConfig,
)
from agentd.modes.entry import daemon_mode  # noqa: E402
from agentd.supervisor.wiring import open_root_supervisor  # noqa: E402
from agentd.telemetry.events import EventLog, RateLimiter  # noqa: E402
from tests.peers import launch  # noqa: E402
from tests.peers.gateway import RecordedRequest, scripted_gateway, text  # noqa: E402

HEADING = "## MCP events as wakes"


class Stamps:
    def __init__(self) -> None:
        self.arrivals: list[tuple[float, str]] = []
        self.armed = 0
        self.wake_ends = 0

    def sink(self, line: dict[str, Any]) -> None:
        if line.get("event") == "trigger.armed":
            self.armed += 1
        elif line.get("event") == "run.end" and line.get("trigger") == "wake":
            self.wake_ends += 1

    def reply(self, request: RecordedRequest) -> dict[str, Any]:
        self.arrivals.append((time.perf_counter(), str(request.messages)))
        return text("ok")

    async def until(self, predicate: Any, timeout: float = 120.0) -> None:
        with trio.fail_after(timeout):
            while not predicate():
                await trio.sleep(0.002)


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def latency(args: argparse.Namespace) -> dict[str, Any]:
    stamps = Stamps()
    push = args.delivery == "push"
    async with (
        scripted_gateway(default=stamps.reply) as gw,
        launch.peer_server(launch.events_server_argv(push=push, next_poll_ms=1000)) as peer,
    ):
        base = peer.url.removesuffix("/mcp")
        cfg = Config(instruction="Handle it.", intelligence=IntelligenceConfig(endpoints=(gw.url,)), modes=ModesConfig(subscribe=("test://counter",), on_events=(EventSubscriptionConfig("ev", "ticket.created"),), debounce=0.0, max_wakes_per_minute=10**9, max_wakes_per_uri_per_minute=10**9), mode="reactive",
                     mcp=(McpServerConfig("ev", peer.url),), )
        log = EventLog(sink=stamps.sink, level="info", run_id="bench", limiter=RateLimiter(limit=0))
        drain = trio.Event()
        samples: dict[str, list[float]] = {"resource": [], "event": []}
        async with (
            httpx.AsyncClient() as side,
            open_root_supervisor(cfg, log=log, env={}, run_id=log.run_id) as supervisor,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(functools.partial(daemon_mode, cfg, log, nursery, supervisor=supervisor, drain=drain))
            await stamps.until(lambda: stamps.armed >= 2)
            await trio.sleep(1.5)  # the first poll/stream is open ("from now")
            for i in range(args.wakes + 10):
                kind = "resource" if i % 2 == 0 else "event"
                ends, seen = stamps.wake_ends, len(stamps.arrivals)
                start = time.perf_counter()
                if kind == "resource":
                    (await side.post(base + "/_test/bump", params={"uri": "test://counter"})).raise_for_status()
                else:
                    (await side.post(base + "/_test/emit", params={"data": json.dumps({"n": i})})).raise_for_status()
                await stamps.until(lambda e=ends: stamps.wake_ends > e)
                if i >= 10:  # warm-up: lazy imports, connection set-up
                    samples[kind].append((stamps.arrivals[seen][0] - start) * 1000)
            drain.set()
    med = {kind: statistics.median(values) for kind, values in samples.items()}
    return {"delivery": args.delivery, "wakes": args.wakes, "resource_median_ms": round(med["resource"], 2),
            "event_median_ms": round(med["event"], 2), "ratio": round(med["event"] / med["resource"], 3),
            "resource_p90_ms": round(statistics.quantiles(samples["resource"], n=10)[-1], 2),
            "event_p90_ms": round(statistics.quantiles(samples["event"], n=10)[-1], 2)}


async def armed_memory(count: int) -> tuple[int, int]:
    """Python heap in use and RSS (KiB) with ``count`` event subscriptions armed and polled once."""
    stamps = Stamps()
    async with (
        scripted_gateway(default=stamps.reply) as gw,
        launch.peer_server(launch.events_server_argv(next_poll_ms=300_000)) as peer,
    ):
        subs = tuple(EventSubscriptionConfig("ev", "ticket.created", {"queue": f"q{i}"}) for i in range(count))
        cfg = Config(instruction="Handle it.", intelligence=IntelligenceConfig(endpoints=(gw.url,)), modes=ModesConfig(on_events=subs), mode="reactive",
                     mcp=(McpServerConfig("ev", peer.url),))
        log = EventLog(sink=stamps.sink, level="info", run_id="bench", limiter=RateLimiter(limit=0))
        drain = trio.Event()
        async with (
            httpx.AsyncClient() as side,
            open_root_supervisor(cfg, log=log, env={}, run_id=log.run_id) as supervisor,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(functools.partial(daemon_mode, cfg, log, nursery, supervisor=supervisor, drain=drain))
            await stamps.until(lambda: stamps.armed >= count, timeout=300)
            base = peer.url.removesuffix("/mcp")
            with trio.fail_after(300):
                while len((await side.get(base + "/_test/events")).json()["polls"]) < count:
                    await trio.sleep(0.2)
            await trio.sleep(1.0)
            heap, rss = tracemalloc.get_traced_memory()[0], _rss_kib()
            drain.set()
    return heap, rss


async def memory(args: argparse.Namespace) -> dict[str, Any]:
    tracemalloc.start()
    heap_1, rss_1 = await armed_memory(1)
    heap_n, rss_n = await armed_memory(args.subscriptions)
    tracemalloc.stop()
    n = args.subscriptions - 1
    return {"subscriptions": args.subscriptions, "heap_kib_per_subscription": round((heap_n - heap_1) / n / 1024, 2),
            "rss_kib_per_subscription": round((rss_n - rss_1) / n, 2)}


def section(lat: dict[str, Any], mem: dict[str, Any], command: str) -> str:
    return f"""{HEADING}

`{command}` ({time.strftime("%Y-%m-%d", time.gmtime())}). One daemon subscribed to a resource (`--subscribe`,
pushed on `subscriptions/listen`) and to an event (`--on-event`, delivered by `{lat["delivery"]}`) of the same
peer process (tests/peers/servers/events_server.py); wakes alternate; each is timed from just before the side-door
POST that causes it to the gateway receiving the wake's first model request ({lat["wakes"]} wakes, after 10 of
warm-up).

| measure | resource update | MCP event |
|---|---|---|
| wake latency, median ms | {lat["resource_median_ms"]} | {lat["event_median_ms"]} |
| wake latency, p90 ms | {lat["resource_p90_ms"]} | {lat["event_p90_ms"]} |

Event ÷ resource (medians): **{lat["ratio"]}** (target ≤ 1.2).

Memory per event subscription, {mem["subscriptions"]} poll subscriptions armed and polled once (each with its own
arguments; the peer suggests 300 s, so each then sleeps) against one: **{mem["heap_kib_per_subscription"]} KiB** of
Python heap (tracemalloc), {mem["rss_kib_per_subscription"]} KiB of RSS (target ≤ 64 KiB). No process and no
connection per subscription: a poll subscription between polls is a sleeping trio task, its cursor and its
pending occurrences.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--wakes", type=int, default=200)
    parser.add_argument("--subscriptions", type=int, default=1000)
    parser.add_argument("--delivery", choices=("push", "poll"), default="push")
    parser.add_argument("--write", action="store_true", help=f"replace the section {HEADING!r} of docs/benchmarks.md")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    lat = trio.run(latency, args)
    mem = trio.run(memory, args)
    if args.json:
        print(json.dumps({"latency": lat, "memory": mem}, indent=2))
    command = "scripts/bench/events.py " + " ".join(sys.argv[1:]).replace("--write", "").strip()
    text_ = section(lat, mem, command.strip())
    print(text_)
    if args.write:
        replace_section(HEADING, text_)


if __name__ == "__main__":
    main()
