"""Wake latency and burst coalescing of the reactive daemon, against the official SDK server.

Setup: the official Python SDK test peer (a separate process, legacy era with ``resources/subscribe``
and a GET stream), the scripted gateway in this process answering every request at once, and
``agentd.modes.entry.daemon_mode`` in this process in ``--mode reactive`` (default ``--debounce``
250 ms, 4 concurrent wakes), subscribed to ``--uris`` counters.

Latency: ``--wakes`` sequential wakes, round robin over the URIs (so each URI is idle and outside its
debounce window when bumped; the leading edge wakes at once). For each wake two intervals end at the
moment the gateway receives the wake's first model request:

* ``notify→model``: from the client receiving ``notifications/resources/updated`` (the ``mcp.updated``
  event, stamped with ``perf_counter`` by the event sink) — agentd's own path: router, watcher,
  ``resources/read`` round trip, run setup, prompt, and the POST to the gateway;
* ``bump→model``: from just before the side-door POST that makes the server change the resource and
  send the notification — adds the side door and the server's notification write.

agentd's share: after each wake, one bare ``resources/read`` of the same URI (agentd's client, its own
connection) and one bare httpx POST of a wake's own body to the same gateway (until its handler runs) are timed;
the share is ``notify→model`` minus both, per wake, in wall time and in CPU time of the trio thread (the
latency part's side-door bumps run in a worker thread, so they are not in that clock). ``--profile FILE``
profiles exactly those windows (thread CPU clock) and prints where the wakes' extra CPU goes, by part.

Bursts: for N in ``--bursts``, N updates of a fresh URI as fast as the side door takes them (8 in
flight), then wait until the daemon is quiet; report the wakes and whether the last wake read N.

``--peer served``: both ends are agentd. The peer is an agentd process serving its self-MCP
(``serve_for_daemon`` over a root supervisor, bearer auth, legacy wire), whose subagents are scripted (no
model, each turn answers at once). Each watched URI is ``agent://subagent/{handle}`` of one warm session; the
bump is a ``subagent.send`` (in a worker thread), whose turn end notifies the handle's subscribers (a warm
session's resource updates at every turn, not once). The floors are the same: a bare read of that resource
through agentd's client and a bare POST to the gateway. No bursts (a handle's reads are views, not counters).

    .venv/bin/python scripts/bench/reactive.py [--wakes 500] [--uris 50] [--bursts 10,100,1000] [--write]
        [--json] [--profile FILE] [--peer sdk|served]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import re
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_doc import replace_section  # noqa: E402  (scripts/bench is on sys.path when run)

from agentd import defaults  # noqa: E402
from agentd.config.model import (  # noqa: E402
    Config,
    IntelligenceConfig,
    McpServerConfig,
    ModesConfig,
    SelfMcpConfig,
    SubagentsConfig,
)
from agentd.modes.entry import daemon_mode  # noqa: E402
from agentd.supervisor.wiring import open_root_supervisor  # noqa: E402
from agentd.telemetry.events import EventLog, RateLimiter  # noqa: E402
from tests.peers import launch  # noqa: E402
from tests.peers.gateway import RecordedRequest, scripted_gateway, text  # noqa: E402

SECTION = "## Reactive wakes"
SERVED_SECTION = "## Reactive wakes: agentd as the peer"
#: After each wake and each floor cycle: let its tail (run end, connection hand-back) finish inside its CPU.
SETTLE = 0.005
FLOOR_HEADER = "x-bench-floor"
_CONTENT = re.compile(r'<resource uri="([^"]+)"[^>]*>\n(.*?)\n</resource>', re.S)


class Bench:
    def __init__(self) -> None:
        self.updated: dict[str, list[float]] = {}
        self.woken: dict[str, list[float]] = {}
        self.requests: list[tuple[float, str, str]] = []  # (perf_counter, uri, content)
        #: This (trio) thread's CPU clock at each ``mcp.updated`` and at each wake's model request.
        self.updated_cpu: dict[str, list[float]] = {}
        self.requests_cpu: list[float] = []
        self.wake_ends = 0
        self.armed = 0
        self.changed = trio.Event()
        #: One wake's request body, re-encoded (agentd's encoding is ``json.dumps`` of it): the bare POST's body.
        self.body: bytes | None = None
        #: perf_counter stamps of bare floor POSTs as the gateway's handler sees them.
        self.floor_arrivals: list[tuple[float, float]] = []  # (perf_counter, thread_time)
        #: Set by the next wake's ``run.end`` (the measured loop waits on it: no polling in the CPU counted).
        self.wake_done: trio.Event | None = None
        #: ``--profile``: exactly the windows the CPU share counts (notify to model request; read; POST).
        self.profile: cProfile.Profile | None = None
        self.floor_profile: cProfile.Profile | None = None

    def sink(self, line: dict[str, Any]) -> None:
        now = time.perf_counter()
        event = line["event"]
        if event == "mcp.updated":
            self.updated.setdefault(str(line.get("uri")), []).append(now)
            self.updated_cpu.setdefault(str(line.get("uri")), []).append(time.thread_time())
            if self.profile is not None:
                self.profile.enable()
        elif event == "reactive.wake":
            self.woken.setdefault(str(line.get("uri")), []).append(now)
        elif event == "run.end" and line.get("trigger") == "wake":
            self.wake_ends += 1
            self.changed.set()
            if self.wake_done is not None:
                self.wake_done.set()
        elif event == "trigger.armed":
            self.armed += 1
            self.changed.set()

    def reply(self, request: RecordedRequest) -> dict[str, Any]:
        now, cpu = time.perf_counter(), time.thread_time()
        for profile in (self.profile, self.floor_profile):
            if profile is not None:
                profile.disable()
        if request.headers.get(FLOOR_HEADER):
            self.floor_arrivals.append((now, cpu))
            return text("ok")
        if self.body is None:
            self.body = json.dumps(request.body).encode()
        users = [m for m in request.messages if m.get("role") == "user"]
        match = _CONTENT.search(str(users[-1]["content"])) if users else None
        if match:
            self.requests.append((now, match.group(1), match.group(2).strip()))
            self.requests_cpu.append(cpu)
        return text("ok")

    async def until(self, predicate: Any, timeout: float = 60.0) -> None:
        with trio.fail_after(timeout):
            while not predicate():
                self.changed = trio.Event()
                if predicate():
                    return
                with trio.move_on_after(0.05):
                    await self.changed.wait()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


#: ``--peer served``: the serving agentd's bearer (a bench value on loopback, not a secret).
SERVED_TOKEN = "bench-served-token"


class ServedSide:
    """The bench's side door to the serving agentd: sync MCP calls over one legacy session (worker threads)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(headers={"authorization": f"Bearer {SERVED_TOKEN}",
                                            "accept": "application/json, text/event-stream"}, timeout=30)
        self.session: str | None = None
        self.ids = 0

    def _post(self, message: dict[str, Any]) -> httpx.Response:
        headers = {"mcp-session-id": self.session} if self.session else {}
        response = self.client.post(self.url, json=message, headers=headers)
        response.raise_for_status()
        return response

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if self.session is None:
            init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}
            self.session = self._post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
                                      ).headers["mcp-session-id"]
            self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.ids += 1
        response = self._post({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params})
        body = response.text
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            body = next(line[5:] for line in body.splitlines() if line.startswith("data:") and '"id"' in line)
        answer = json.loads(body)
        result = answer.get("result")
        if not isinstance(result, dict) or result.get("isError"):
            raise RuntimeError(f"{method}: {answer}")
        return result

    def spawn_warm(self) -> str:
        result = self.call("tools/call", {"name": "subagent.spawn", "arguments": {"instruction": "0", "warm": True}})
        return str(result["structuredContent"]["handle"])

    def send(self, uri: str) -> None:
        handle = uri.removeprefix("agent://subagent/")
        self.call("tools/call", {"name": "subagent.send", "arguments": {"handle": handle, "message": "next"}})


def serve_peer(port: int, warm: int) -> None:
    """``--serve-peer``: agentd serving its self-MCP on ``port`` with scripted subagents (its own process)."""
    from agentd.oversight.drain import DrainLatch, use_drain
    from agentd.selfmcp.serving import serve_for_daemon
    from agentd.telemetry.events import null_log

    url = f"http://127.0.0.1:{port}/mcp"
    cfg = Config(instruction="bench peer", intelligence=IntelligenceConfig(endpoints=("http://127.0.0.1:9/v1",)), serve=SelfMcpConfig(mcp=url, bearer=SERVED_TOKEN, max_warm=warm, max_spawns=warm), subagents=SubagentsConfig(max_children=warm, max_total=max(warm, defaults.MAX_SUBAGENTS), spawn_burst=warm, spawn_rate=10_000), )

    async def main() -> None:
        with use_drain(DrainLatch()):
            async with open_root_supervisor(cfg, log=null_log(), env={}, test_script=lambda r, h: {"steps": [["echo"]]},
                                            ) as supervisor, trio.open_nursery() as nursery:
                await nursery.start(functools.partial(serve_for_daemon, cfg, null_log(), env={}, supervisor=supervisor))
                print(f"LISTENING {url}", flush=True)  # then serves until killed

    trio.run(main)


@asynccontextmanager
async def the_peer(args: argparse.Namespace, bursts: list[int]) -> AsyncIterator[Peer]:
    """The watched server: the official SDK server (counters), or an agentd serving warm sessions."""
    if args.peer == "sdk":
        async with launch.peer_server(launch.sdk_server_argv()) as peer:
            yield Peer(peer.url, {}, [f"test://bench/{i}" for i in range(args.uris)],
                       [f"test://burst/{n}" for n in bursts], "test://bench/unwatched",
                       functools.partial(launch.abump, peer.origin), peer.origin + "/_test/bump")
        return
    argv = [sys.executable, __file__, "--serve-peer", str(launch.free_port()), "--uris", str(args.uris + 1)]
    async with launch.peer_server(argv) as peer:
        side = ServedSide(peer.url)
        try:
            handles = [await trio.to_thread.run_sync(side.spawn_warm) for _ in range(args.uris + 1)]
            uris = [f"agent://subagent/{h}" for h in handles]

            async def send(uri: str) -> None:
                await trio.to_thread.run_sync(side.send, uri)

            yield Peer(peer.url, {"authorization": f"Bearer {SERVED_TOKEN}"}, uris[:-1], [], uris[-1], send, "")
        finally:
            side.client.close()


@attrs.frozen
class Peer:
    url: str
    headers: dict[str, str]
    uris: list[str]
    burst_uris: list[str]
    unwatched: str
    #: One update of a URI, in a worker thread (its CPU is not in the trio thread's clock).
    abump: Callable[[str], Awaitable[object]]
    #: The side door for bursts (the SDK server's), or "" (none).
    bump_url: str


async def run(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench()
    bursts = [int(n) for n in args.bursts.split(",") if n] if args.peer == "sdk" else []
    async with scripted_gateway(default=bench.reply) as gw, the_peer(args, bursts) as peer:
        uris, burst_uris, unwatched = peer.uris, peer.burst_uris, peer.unwatched
        cfg = Config(instruction="Report the counter.", intelligence=IntelligenceConfig(endpoints=(gw.url,)), modes=ModesConfig(subscribe=tuple(uris + burst_uris), debounce=args.debounce, max_concurrent_wakes=4, max_wakes_per_minute=10**9, max_wakes_per_uri_per_minute=10**9), mode="reactive",
                     mcp=(McpServerConfig("srv", peer.url, headers=peer.headers),), # the wake budget (60 a minute by default) would hold sequential wakes back: out of the way
                     )
        # Every line counted: the log's rate limit (50 a second per event) would hide arms of a fast start.
        # At the daemon's default level (info): every event the bench stamps is an info line.
        log = EventLog(sink=bench.sink, level=defaults.LOG_LEVEL, run_id="bench", limiter=RateLimiter(limit=0))
        drain = trio.Event()
        async with (
            httpx.AsyncClient(limits=httpx.Limits(keepalive_expiry=1.0)) as side,
            open_root_supervisor(cfg, log=log, env={}, run_id=log.run_id) as supervisor,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(functools.partial(daemon_mode, cfg, log, nursery, supervisor=supervisor, drain=drain))
            await bench.until(lambda: bench.armed >= len(uris) + len(burst_uris))
            bump_url = peer.bump_url
            # A daemon's steady state: arming (8 URIs at a time) leaves idle connections that httpx's pool scans on
            # every request until its 5 s keep-alive expires them; wakes long after the start never meet them.
            await trio.sleep(args.settle)

            async def bump(uri: str) -> None:
                # Its connections idle through the latency part (those bumps run in a thread): expired after 1 s,
                # before the server drops them itself (uvicorn: 5 s), so a burst never posts on a dropped one.
                if not bump_url:
                    await peer.abump(uri)
                    return
                (await side.post(bump_url, params={"uri": uri})).raise_for_status()

            # warm-up: first runs pay lazy imports and connection set-up
            for uri in uris[:5]:
                ends = bench.wake_ends
                await bump(uri)
                await bench.until(lambda e=ends: bench.wake_ends > e)
            assert bench.body is not None
            body = bench.body
            bench.requests.clear()
            bench.requests_cpu.clear()
            bench.updated.clear()
            bench.updated_cpu.clear()
            bench.woken.clear()

            # The floor, interleaved with the wakes (same load, same moment): one bare `resources/read` of the
            # same URI through agentd's client on its own connection, and one bare httpx POST of the wake's own
            # request body to the same gateway (to the moment its handler runs, where a wake's interval ends).
            # What a wake takes beyond those two is agentd's share, in wall time and in CPU time of this trio
            # thread (the side-door bumps run in a worker thread, so their CPU is not in the thread's clock).
            from agentd.client import open_mcp_pool
            from agentd.telemetry.events import null_log

            gw_headers = {"content-type": "application/json", "accept": "application/json", FLOOR_HEADER: "1"}
            notify_ms: list[float] = []
            bump_ms: list[float] = []
            read_ms: list[float] = []
            run_ms: list[float] = []
            floor_ms: list[float] = []
            post_ms: list[float] = []
            share_ms: list[float] = []
            share_cpu: list[float] = []
            wake_cpu: list[float] = []
            floor_cpu: list[float] = []
            profile = cProfile.Profile(time.thread_time) if args.profile else None
            floor_profile = cProfile.Profile(time.thread_time) if args.profile else None
            async with (open_mcp_pool([McpServerConfig("floor", peer.url, headers=peer.headers)], log=null_log()) as floor_pool,
                        httpx.AsyncClient() as bare):
                for _ in range(10):  # warm the floor's connections too
                    await floor_pool.read_resource(uris[0], "floor")
                    (await bare.post(gw.completions_url, content=body, headers=gw_headers)).raise_for_status()
                for i in range(args.wakes):
                    uri = uris[i % len(uris)]
                    ends, seen = bench.wake_ends, len(bench.requests)
                    cpu0 = time.process_time()
                    bench.profile = profile
                    bench.wake_done = done = trio.Event()
                    start = time.perf_counter()
                    await peer.abump(uri)
                    with trio.fail_after(60):
                        while True:
                            await done.wait()
                            # This URI's wake. Rarely, another URI's follow-up (an update that landed as its
                            # wake read) ends first: it is not this wake, so wait on.
                            mine = next((n for n in range(seen, len(bench.requests))
                                         if bench.requests[n][1] == uri), None)
                            if mine is not None:
                                break
                            bench.wake_done = done = trio.Event()
                    assert bench.wake_ends > ends
                    await trio.sleep(SETTLE)
                    bench.profile = None
                    wake_cpu.append((time.process_time() - cpu0) * 1000)
                    at, _, _ = bench.requests[mine]
                    bump_ms.append((at - start) * 1000)
                    notify_ms.append((at - bench.updated[uri][-1]) * 1000)
                    read_ms.append((bench.woken[uri][-1] - bench.updated[uri][-1]) * 1000)
                    run_ms.append((at - bench.woken[uri][-1]) * 1000)
                    wake_thread_cpu = (bench.requests_cpu[mine] - bench.updated_cpu[uri][-1]) * 1000

                    cpu0 = time.process_time()
                    await peer.abump(unwatched)  # the side door's CPU, as a wake has it
                    if floor_profile is not None:
                        floor_profile.enable()
                    t0, c0 = time.perf_counter(), time.thread_time()
                    await floor_pool.read_resource(uri, "floor")
                    t1, c1 = time.perf_counter(), time.thread_time()
                    bench.floor_profile = floor_profile  # on until the gateway's handler sees the POST
                    arrivals = len(bench.floor_arrivals)
                    (await bare.post(gw.completions_url, content=body, headers=gw_headers)).raise_for_status()
                    await trio.sleep(SETTLE)
                    bench.floor_profile = None
                    floor_cpu.append((time.process_time() - cpu0) * 1000)
                    floor_ms.append((t1 - t0) * 1000)
                    # to the moment the gateway's handler sees it, as the wake's interval ends
                    arrived, arrived_cpu = bench.floor_arrivals[arrivals]
                    post_ms.append((arrived - t1) * 1000)
                    share_ms.append(notify_ms[-1] - floor_ms[-1] - post_ms[-1])
                    share_cpu.append(wake_thread_cpu - (c1 - c0) * 1000 - (arrived_cpu - c1) * 1000)
            if profile is not None and floor_profile is not None:
                profile.dump_stats(args.profile)
                floor_profile.dump_stats(args.profile + ".floor")
            cpu_per_wake = statistics.median(wake_cpu)
            cpu_floor = statistics.median(floor_cpu)

            burst_rows = []
            for n, uri in zip(bursts, burst_uris, strict=True):
                before = len(bench.requests)
                limiter = trio.CapacityLimiter(8)

                async def one(uri: str = uri) -> None:
                    async with limiter:
                        await bump(uri)

                t0 = time.perf_counter()
                async with trio.open_nursery() as fire:
                    for _ in range(n):
                        fire.start_soon(one)
                sent_s = time.perf_counter() - t0

                def final_read(uri: str = uri, n: int = n) -> bool:
                    reads = [c for _, u, c in bench.requests if u == uri]
                    return bool(reads) and reads[-1] == str(n)

                await bench.until(final_read, timeout=120)
                await trio.sleep(max(0.5, args.debounce * 2))  # stay quiet: no further wake may follow
                reads = [c for _, u, c in bench.requests[before:] if u == uri]
                burst_rows.append({"updates": n, "sent_s": sent_s, "wakes": len(reads),
                                   "last_read": reads[-1] if reads else None, "final_ok": reads[-1] == str(n)})
            drain.set()
    return {
        "peer": args.peer,
        "wakes": args.wakes,
        "uris": args.uris,
        "debounce": args.debounce,
        "settle": args.settle,
        "notify_median": statistics.median(notify_ms),
        "notify_p99": pct(notify_ms, 0.99),
        "bump_median": statistics.median(bump_ms),
        "read_median": statistics.median(read_ms),
        "read_p99": pct(read_ms, 0.99),
        "run_median": statistics.median(run_ms),
        "run_p99": pct(run_ms, 0.99),
        "floor_median": statistics.median(floor_ms),
        "floor_p99": pct(floor_ms, 0.99),
        "post_median": statistics.median(post_ms),
        "post_p99": pct(post_ms, 0.99),
        "share_median": statistics.median(share_ms),
        "share_p99": pct(share_ms, 0.99),
        "share_cpu_median": statistics.median(share_cpu),
        "cpu_floor": cpu_floor,
        "bump_p99": pct(bump_ms, 0.99),
        "bursts": burst_rows,
        "cpu_per_wake": cpu_per_wake,
        "load": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }


#: Where a profiled wake's extra CPU goes (``--profile``): the first matching part names a function's file.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("event lines", ("agentd/telemetry/events.py", "time.gmtime", "time.strftime", "scripts/bench")),
    ("catalogue and prompt", ("agentd/agent/catalogue.py", "agentd/agent/prompt.py", "agentd/agent/control.py",
                              "agentd/modes/wake_prompt.py", "agentd/intelligence/names.py")),
    ("run set-up and the loop", ("agentd/modes/runs.py", "agentd/modes/entry.py", "agentd/run.py",
                                 "agentd/agent/", "agentd/supervisor/", "agentd/modes/selftools.py",
                                 "agentd/telemetry/", "attr/", "attrs generated methods agentd")),
    ("routing (watcher, router, wake)", ("agentd/modes/",)),
    ("intelligence client (body, POST)", ("agentd/intelligence/", "agentd/transport/", "json/")),
    ("MCP client (notification, read)", ("agentd/client/", "agentd/mcp/")),
    ("trio scheduling and cancel scopes", ("trio/", "outcome/", "contextlib", "attrs generated methods trio")),
    ("httpx / httpcore / h11 beyond the floor's", ("httpx/", "httpcore/", "h11/")),
)


def breakdown(path: str) -> list[tuple[str, float]]:
    """The profiled windows' CPU (thread clock) of the wakes minus that of the floors, by part, as fractions."""
    import pstats

    totals: dict[str, float] = {}
    for suffix, sign in (("", 1.0), (".floor", -1.0)):
        for (file, _line, name), stat in pstats.Stats(path + suffix).stats.items():  # type: ignore[attr-defined]
            if "select.epoll" in name:
                continue
            where = f"{file} {name}"
            part = next((label for label, marks in PARTS if any(m in where for m in marks)), "other (builtins, stdlib)")
            totals[part] = totals.get(part, 0.0) + sign * stat[2]
    whole = sum(totals.values()) or 1.0
    return sorted(((part, value / whole) for part, value in totals.items()), key=lambda kv: -kv[1])


def render(r: dict[str, Any], command: str) -> str:
    rows = "\n".join(
        f"| {b['updates']} | {b['sent_s'] * 1000:.0f} | {b['wakes']} | {b['last_read']} | "
        f"{'yes' if b['final_ok'] else '**NO**'} |" for b in r["bursts"]
    )
    return f"""{SECTION}

Latency from an update to the wake's first model request, over {r['wakes']} sequential wakes (round robin
over {r['uris']} subscribed URIs, `--debounce {r['debounce']:g}`: each URI is bumped outside its debounce window,
so its leading edge wakes at once and no debounce delay is in the numbers; the first {r['settle']:g} s after
arming, `--settle`, unmeasured; official SDK server in its own
process, scripted gateway and agentd in this process, events at the default level). `notify→model` starts when
agentd's client receives `notifications/resources/updated` and ends when the gateway's handler sees the wake's
first model request; `bump→model` starts before the side-door POST that makes the server change the resource
and notify.

The floor is measured in the same run, interleaved with the wakes: after each wake, one bare `resources/read` of
the same URI through agentd's client on its own connection, then one bare httpx POST of a wake's own request
body to the same gateway (until its handler runs, where a wake's interval ends). agentd's share is
notify→model minus both, per wake; its CPU share is the same difference in CPU time of the trio thread (the
side-door bumps run in a worker thread).

| interval | median (ms) | p99 (ms) |
|---|---|---|
| notify→model | {r['notify_median']:.2f} | {r['notify_p99']:.2f} |
| of which: notify→read done (router, watcher, `resources/read` round trip) | {r['read_median']:.2f} | {r['read_p99']:.2f} |
| of which: read done→model (run setup, prompt, catalogue, POST to the gateway) | {r['run_median']:.2f} | {r['run_p99']:.2f} |
| bump→model (plus side door and the server's notification) | {r['bump_median']:.2f} | {r['bump_p99']:.2f} |
| floor: one bare `resources/read` through agentd's client, same server | {r['floor_median']:.2f} | {r['floor_p99']:.2f} |
| floor: one bare httpx POST of the wake's body to the same gateway, until its handler runs | {r['post_median']:.2f} | {r['post_p99']:.2f} |
| **agentd's share**: notify→model minus both floors, per wake | **{r['share_median']:.2f}** | {r['share_p99']:.2f} |
| **agentd's CPU share** (trio thread), per wake | **{r['share_cpu_median']:.2f}** | |

CPU time of this process per whole wake (to its `run.end`; agentd's daemon plus the in-process scripted gateway)
**{r['cpu_per_wake']:.2f} ms**, per floor cycle (the read and the POST, to their ends) {r['cpu_floor']:.2f} ms.

Bursts: N updates of one URI as fast as the side door takes them (8 in flight), then quiet.

| updates | sent in (ms) | wakes | last wake read | final state read |
|---|---|---|---|---|
{rows}

Target: agentd's share at most 1 ms (median), and the final state always read. Machine: {r['cpus']} CPUs,
load average {r["load"]:.2f} at the end of the run.

Reproduce: `{command}`
"""


def render_served(r: dict[str, Any], command: str) -> str:
    return f"""{SERVED_SECTION}

Both ends agentd (`--peer served`): the watched server is an agentd process serving its self-MCP (bearer auth,
legacy wire; its subagents scripted, so a turn answers at once), and each of the {r['uris']} watched URIs is
`agent://subagent/{{handle}}` of one warm session, updated at each turn's end; the update is a `subagent.send`
from a worker thread. {r['wakes']} sequential wakes, round robin, `--debounce {r['debounce']:g}`, starting {r['settle']:g} s after
the subscriptions were armed (`--settle`: the connections arming opened have expired, as in a daemon that armed
long ago; each costs every request a scan in httpx's pool while it lasts); the floors as in
"Reactive wakes" (a bare read of the same `agent://subagent/{{handle}}` through agentd's client, with the bearer,
and a bare POST of the wake's body to the same gateway), interleaved.

| interval | median (ms) | p99 (ms) |
|---|---|---|
| notify→model | {r['notify_median']:.2f} | {r['notify_p99']:.2f} |
| of which: notify→read done | {r['read_median']:.2f} | {r['read_p99']:.2f} |
| of which: read done→model | {r['run_median']:.2f} | {r['run_p99']:.2f} |
| `subagent.send`→model (plus the send, the scripted turn and the server's notification) | {r['bump_median']:.2f} | {r['bump_p99']:.2f} |
| floor: one bare `resources/read` of the handle through agentd's client | {r['floor_median']:.2f} | {r['floor_p99']:.2f} |
| floor: one bare httpx POST of the wake's body to the same gateway | {r['post_median']:.2f} | {r['post_p99']:.2f} |
| **agentd's share**: notify→model minus both floors, per wake | **{r['share_median']:.2f}** | {r['share_p99']:.2f} |
| **agentd's CPU share** (trio thread), per wake | **{r['share_cpu_median']:.2f}** | |

Machine: {r['cpus']} CPUs, load average {r["load"]:.2f} at the end of the run.

Reproduce: `{command}`
"""


def write_section(section: str) -> None:
    replace_section(SERVED_SECTION if section.startswith(SERVED_SECTION) else SECTION, section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--wakes", type=int, default=500)
    parser.add_argument("--uris", type=int, default=50)
    parser.add_argument("--bursts", default="10,100,1000")
    parser.add_argument("--debounce", type=float, default=0.25)
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON line (for A/B runs)")
    parser.add_argument("--profile", metavar="FILE", help="cProfile (thread CPU) the windows the CPU share counts "
                        "into FILE (the floor's into FILE.floor) and print where the difference goes")
    parser.add_argument("--peer", choices=("sdk", "served"), default="sdk", help="the watched server: the official "
                        "SDK server's counters, or agentd's own served agent://subagent/{handle} of warm sessions")
    parser.add_argument("--settle", type=float, default=6.0, help="seconds between arming and the first wake "
                        "(default 6: the arming's extra connections have expired, as in a daemon that armed long ago)")
    parser.add_argument("--serve-peer", type=int, metavar="PORT", help=argparse.SUPPRESS)  # --peer served's child
    parser.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    args = parser.parse_args()
    if args.serve_peer is not None:
        serve_peer(args.serve_peer, args.uris)
        return
    result = trio.run(run, args)
    if args.profile:
        for part, fraction in breakdown(args.profile):
            print(f"{fraction * 100:5.1f} %  {part}")
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "bursts"}))
        return
    command = ".venv/bin/python scripts/bench/reactive.py " + " ".join(sys.argv[1:])
    section = (render_served if args.peer == "served" else render)(result, command.strip())
    print(section)
    if args.write:
        write_section(section)


if __name__ == "__main__":
    main()
