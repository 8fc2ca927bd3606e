"""Benchmark the self-MCP server: ``tools/call status`` round trips against three servers, in one run.

Targets, each in its own process pinned to CPU 0 (the client runs on CPU 1):

- ``agentd``: agentd's self-MCP (``McpAsgiApp`` over the sans-io core) as the daemon serves it (``serve_mcp``),
  legacy wire with a session, JSON responses;
- ``floor``: a bare ASGI app on hypercorn's own trio worker (``hypercorn.trio.serve``, agentd's serving
  limits as config) that ``json.loads`` the body and answers the same bytes agentd's ``status`` answers, with no
  checks and no routing (the floor of this stack);
- ``sdk``: the official Python SDK (``MCPServer`` with a ``status`` tool), stateful, JSON responses,
  on the same hypercorn trio worker;
- ``sdk-uvicorn``: the same SDK server on uvicorn (asyncio, h11), the SDK's best measured configuration.

The client is a lean HTTP/1.1 keep-alive client on raw trio sockets (one connection per concurrent
client; each first does ``initialize``/``initialized`` and then loops ``tools/call status``), so the
numbers measure the servers, not httpx. Usage::

    .venv/bin/python scripts/bench/server.py [--seconds 3] [--reps 3]
    .venv/bin/python scripts/bench/server.py --app-only    # the ASGI app alone, no HTTP
    .venv/bin/python scripts/bench/server.py --sched       # trio scheduler work, Python calls per sequential call
    .venv/bin/python scripts/bench/server.py --targets agentd,floor --baseline ../agentd-main  # before/after
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

STATUS_CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "status", "arguments": {}}}
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


# -- servers (run in a child process) ----------------------------------------------------------------------

def _hypercorn_config(port: int) -> Any:
    """The hypercorn config of every hypercorn target: agentd's serving limits (the idle limit, no ``server``
    header, long-lived keep-alive connections), as agentd served with when it ran on hypercorn's protocols."""
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.keep_alive_timeout = 10.0
    config.graceful_timeout = 3.0
    config.ssl_handshake_timeout = 10.0
    config.accesslog = None
    config.include_server_header = False
    config.keep_alive_max_requests = 100_000
    config.h2_max_concurrent_streams = 32
    return config


#: What agentd's ``status`` tool answers in the benchmark (its fields and value types), for the floor to echo.
_FLOOR_STATUS = {"run_id": "bench", "mode": "loop", "version": "0.1.0", "pid": 0, "uptime_ms": 0,
                 "spawns": {"spawned": 0, "served_running": 0, "refused": 0}, "refusals": {}}
_STARTED = time.monotonic()


async def floor_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The floor: parse the body, answer the same bytes agentd answers (an ``initialize`` gets a session id
    header, so both servers see the same request bytes too), nothing else: no checks, no routing."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body)
    status = dict(_FLOOR_STATUS, pid=os.getpid(), uptime_ms=int((time.monotonic() - _STARTED) * 1000))
    text = json.dumps(status, separators=(",", ":"))
    out = json.dumps({"jsonrpc": "2.0", "id": request.get("id"), "result": {
        "content": [{"type": "text", "text": text}], "structuredContent": status, "isError": False}},
        separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]
    if request.get("method") == "initialize":
        headers.append((b"mcp-session-id", b"0123456789abcdef0123456789abcdef"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


def serve_floor(port: int) -> None:
    import trio
    from hypercorn.trio import serve

    trio.run(serve, floor_app, _hypercorn_config(port))


def _agentd_surface() -> Any:
    from agentd.selfmcp.backend import Refusal, RunView, ServedSpawn
    from agentd.selfmcp.surface import AgentInfo, SelfMcpSurface

    class IdleBackend:
        async def spawn(self, request: ServedSpawn) -> str | Refusal:
            return Refusal("bench: no spawns")

        async def send(self, handle: str, message: str) -> Refusal | None:
            return Refusal("bench")

        def view(self, handle: str) -> RunView | None:
            return None

        async def wait(self, handle: str) -> RunView:
            raise AssertionError

        async def cancel(self, handle: str) -> RunView | None:
            return None

        def counts(self) -> dict[str, int]:
            return {"spawned": 0}

    return SelfMcpSurface(IdleBackend(), AgentInfo(run_id="bench", mode="loop"))


def serve_agentd(port: int) -> None:
    """The daemon's own serving path (``serve_mcp``: agentd's accept loop and its own HTTP/1.1 on h11)."""
    import trio

    from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
    from agentd.transport.serve import ServeConfig, serve_mcp

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            surface = _agentd_surface()
            await nursery.start(surface.run)
            app = McpAsgiApp(surface, AsgiOptions(max_sessions=1024))
            await serve_mcp(app, ServeConfig(f"http://127.0.0.1:{port}/mcp", max_per_client=1024),
                            shutdown_trigger=trio.sleep_forever)

    trio.run(main)


def serve_sdk(port: int) -> None:
    import trio
    from hypercorn.trio import serve
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(name="sdk", version="0")

    @server.tool()
    def status() -> dict[str, Any]:
        """Status."""
        return {"run_id": "bench", "mode": "loop"}

    app = server.streamable_http_app(json_response=True, max_sessions=None)
    trio.run(serve, app, _hypercorn_config(port))


def serve_sdk_uvicorn(port: int) -> None:
    """The SDK's best configuration measured in the perf baseline: uvicorn (asyncio + h11), stateful, JSON."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(name="sdk", version="0")

    @server.tool()
    def status() -> dict[str, Any]:
        """Status."""
        return {"run_id": "bench", "mode": "loop"}

    app = server.streamable_http_app(json_response=True, max_sessions=None)
    uvicorn.run(app, host="127.0.0.1", port=port, loop="asyncio", http="h11", log_level="error", access_log=False)


SERVERS = {"agentd": serve_agentd, "floor": serve_floor, "sdk": serve_sdk, "sdk-uvicorn": serve_sdk_uvicorn}


# -- the client -------------------------------------------------------------------------------------------

def _request(port: int, body: dict[str, Any], session: str | None) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    head = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
            "Accept: application/json, text/event-stream", f"Content-Length: {len(data)}"]
    if session:
        head += [f"Mcp-Session-Id: {session}", "MCP-Protocol-Version: 2025-11-25"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


class Conn:
    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buf = b""

    async def roundtrip(self, payload: bytes) -> tuple[int, dict[str, str], bytes]:
        await self.stream.send_all(payload)
        while b"\r\n\r\n" not in self.buf:
            self.buf += await self._more()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(self.buf) < n:
                self.buf += await self._more()
            body, self.buf = self.buf[:n], self.buf[n:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in self.buf:
                    self.buf += await self._more()
                size_line, _, self.buf = self.buf.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    self.buf += await self._more()
                body += self.buf[:size]
                self.buf = self.buf[size + 2:]
                if size == 0:
                    break
        else:
            body = b""
        return status, headers, body

    async def _more(self) -> bytes:
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionError("server closed")
        return bytes(data)


async def _client(port: int, gate: Any, latencies: list[float], check: bool) -> None:
    """One keep-alive connection; the ``check`` client also records the reply's size (head and body)."""
    import trio

    conn = Conn(await trio.open_tcp_stream("127.0.0.1", port))
    status, headers, body = await conn.roundtrip(_request(port, INIT, None))
    assert status == 200, (status, body)
    session = headers.get("mcp-session-id")
    await conn.roundtrip(_request(port, INITIALIZED, session))
    payload = _request(port, STATUS_CALL, session)
    gate.ready += 1
    await gate.go.wait()  # every client is connected and initialized: measure calls only
    while time.perf_counter() < gate.deadline:
        t0 = time.perf_counter()
        status, headers, body = await conn.roundtrip(payload)
        latencies.append(time.perf_counter() - t0)
        if check:
            assert status == 200, (status, body[:200])
            assert b'"result"' in body, body[:200]
            gate.reply_bytes = (sum(len(k) + len(v) + 4 for k, v in headers.items()), len(body))
    await conn.stream.aclose()


def run_load(port: int, clients: int, seconds: float) -> dict[str, float]:
    import trio

    latencies: list[float] = []

    class Gate:
        ready = 0
        deadline = 0.0
        reply_bytes = (0, 0)
        go: Any = None

    gate = Gate()
    elapsed = 0.0

    async def main() -> None:
        nonlocal elapsed
        gate.go = trio.Event()
        async with trio.open_nursery() as nursery:
            for i in range(clients):
                nursery.start_soon(_client, port, gate, latencies, i == 0)
            while gate.ready < clients:
                await trio.sleep(0.01)
            start = time.perf_counter()
            gate.deadline = start + seconds
            gate.go.set()
        elapsed = time.perf_counter() - start

    trio.run(main)
    latencies.sort()
    return {
        "calls": len(latencies),
        "calls_per_s": len(latencies) / elapsed,
        "p50_us": latencies[len(latencies) // 2] * 1e6,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
        "reply_head_bytes": gate.reply_bytes[0],
        "reply_body_bytes": gate.reply_bytes[1],
    }


def _cpu_seconds(pid: int) -> float:
    """The server process's user+system CPU time (what it costs per call, whatever else the machine runs)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def app_only(calls: int = 2000, rounds: int = 10) -> dict[str, float]:
    """CPU µs per ``tools/call status`` inside the ASGI app alone (no HTTP, no sockets): agentd vs the floor app.

    Blocks of ``calls`` alternate between the apps (and an empty app, the harness's own cost, which is
    subtracted) ``rounds`` times; each figure is the median block's process CPU time per call, so other load
    on the machine moves it little."""
    import trio

    from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp

    async def empty_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        pass

    def request(body: bytes, sid: str | None) -> tuple[dict[str, Any], Any]:
        headers = [(b"host", b"127.0.0.1:1"), (b"content-type", b"application/json"),
                   (b"accept", b"application/json, text/event-stream"),
                   (b"content-length", str(len(body)).encode())]
        if sid:
            headers += [(b"mcp-session-id", sid.encode()), (b"mcp-protocol-version", b"2025-11-25")]
        # as hypercorn hands a request over: a memory channel holding the body, then its end
        sender, receiver = trio.open_memory_channel[dict[str, Any]](10)
        sender.send_nowait({"type": "http.request", "body": body, "more_body": True})
        sender.send_nowait({"type": "http.request", "body": b"", "more_body": False})
        return {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}, receiver.receive

    async def send(message: dict[str, Any]) -> None:
        pass

    async def block(app: Any, sid: str | None) -> float:
        body = json.dumps(STATUS_CALL).encode()
        start = time.process_time()
        for _ in range(calls):
            scope, receive = request(body, sid)
            await app(scope, receive, send)
        return (time.process_time() - start) / calls * 1e6

    async def main() -> dict[str, float]:
        async with trio.open_nursery() as nursery:
            surface = _agentd_surface()
            await nursery.start(surface.run)
            agentd = McpAsgiApp(surface, AsgiOptions())
            sent: list[dict[str, Any]] = []

            async def keep(message: dict[str, Any]) -> None:
                sent.append(message)

            scope, receive = request(json.dumps(INIT).encode(), None)
            await agentd(scope, receive, keep)
            sid = dict(sent[0]["headers"])[b"mcp-session-id"].decode()
            scope, receive = request(json.dumps(STATUS_CALL).encode(), sid)
            await agentd(scope, receive, keep)
            assert b'"result"' in sent[-1]["body"]
            times: dict[str, list[float]] = {"agentd": [], "floor": [], "harness": []}
            for _ in range(rounds):
                times["agentd"].append(await block(agentd, sid))
                times["floor"].append(await block(floor_app, None))
                times["harness"].append(await block(empty_app, None))
            nursery.cancel_scope.cancel()
        harness = statistics.median(times["harness"])
        return {"agentd_app_cpu_us": statistics.median(times["agentd"]) - harness,
                "floor_app_cpu_us": statistics.median(times["floor"]) - harness, "harness_cpu_us": harness}

    return trio.run(main)


def sched_counts(calls: int = 2000) -> dict[str, dict[str, float]]:
    """Trio scheduler work per sequential ``tools/call status``: agentd's server (``serve_mcp``) vs the floor
    (hypercorn's own ``serve``), same hypercorn config.

    Server and client share one ``trio.run`` (the client's own steps are in both counts alike); a
    ``trio.abc.Instrument`` counts tasks spawned, task steps and I/O waits while ``calls`` requests run, then
    ``cProfile`` counts the Python function calls per round trip (client and server: the same client for
    every target, so a difference is the server's; unlike CPU time, not moved by other load).
    """
    import cProfile

    import trio

    from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp

    class Counter(trio.abc.Instrument):
        def __init__(self) -> None:
            self.spawned = self.steps = self.io_waits = 0

        def task_spawned(self, task: Any) -> None:
            self.spawned += 1

        def before_task_step(self, task: Any) -> None:
            self.steps += 1

        def before_io_wait(self, timeout: float) -> None:
            self.io_waits += 1

    async def measure(app: Any, agentd: bool) -> dict[str, float]:
        port = _free_port()
        async with trio.open_nursery() as nursery:
            if agentd:  # the daemon's serving path: agentd's accept loop and its own HTTP/1.1 on h11
                from agentd.transport.serve import ServeConfig, serve_mcp

                await nursery.start(lambda task_status: serve_mcp(
                    app, ServeConfig(f"http://127.0.0.1:{port}/mcp", max_per_client=1024),
                    shutdown_trigger=trio.sleep_forever, task_status=task_status))
            else:
                await nursery.start(_serve_started, app, port)
            conn = Conn(await trio.open_tcp_stream("127.0.0.1", port))
            _, headers, _ = await conn.roundtrip(_request(port, INIT, None))
            session = headers.get("mcp-session-id")
            await conn.roundtrip(_request(port, INITIALIZED, session))
            payload = _request(port, STATUS_CALL, session)
            for _ in range(50):
                await conn.roundtrip(payload)
            counter = Counter()
            trio.lowlevel.add_instrument(counter)
            for _ in range(calls):
                await conn.roundtrip(payload)
            trio.lowlevel.remove_instrument(counter)
            profile = cProfile.Profile()  # deterministic, unlike CPU time on a loaded machine
            profile.enable()
            for _ in range(calls // 4):
                await conn.roundtrip(payload)
            profile.disable()
            await conn.stream.aclose()
            nursery.cancel_scope.cancel()
        return {"tasks_spawned": counter.spawned / calls, "task_steps": counter.steps / calls,
                "io_waits": counter.io_waits / calls,
                "python_calls": sum(entry.callcount for entry in profile.getstats()) / (calls // 4)}

    async def _serve_started(app: Any, port: int, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        from hypercorn.trio import serve

        await serve(app, _hypercorn_config(port), task_status=task_status)

    async def main() -> dict[str, dict[str, float]]:
        async with trio.open_nursery() as nursery:
            surface = _agentd_surface()
            await nursery.start(surface.run)
            out = {"agentd": await measure(McpAsgiApp(surface, AsgiOptions(max_sessions=1024)), True),
                   "floor": await measure(floor_app, False)}
            nursery.cancel_scope.cancel()
        return out

    return trio.run(main)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_up(port: int) -> None:
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server on {port} did not come up")


def bench(target: str, seconds: float, pin: bool, baseline: Path | None = None) -> dict[str, dict[str, float]]:
    """One server process under load; ``baseline`` (target ``baseline``) serves agentd from another checkout."""
    port = _free_port()
    root, script, serve = (baseline, baseline / "scripts/bench/server.py", "agentd") if target == "baseline" \
        else (ROOT, Path(__file__), target)
    cmd = [sys.executable, str(script), "--serve", serve, "--port", str(port)]
    if pin:
        cmd = ["taskset", "-c", "0", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root)
    try:
        _wait_up(port)
        run_load(port, 1, 0.5)  # warm up
        out = {}
        for clients in (1, 16, 64):
            before = _cpu_seconds(proc.pid)
            out[str(clients)] = run_load(port, clients, seconds)
            calls = out[str(clients)]["calls"]
            out[str(clients)]["cpu_us_per_call"] = (_cpu_seconds(proc.pid) - before) / max(calls, 1) * 1e6
        return out
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", choices=sorted(SERVERS))
    parser.add_argument("--port", type=int)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--targets", default="agentd,floor,sdk,sdk-uvicorn")
    parser.add_argument("--app-only", action="store_true", help="only the in-process ASGI app cost per call")
    parser.add_argument("--sched", action="store_true", help="trio scheduler work per sequential call")
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. a git worktree of main) whose agentd "
                        "runs as target 'baseline' in the same run: before/after")
    args = parser.parse_args()
    if args.serve:
        SERVERS[args.serve](args.port)
        return
    if args.app_only:
        print(json.dumps(app_only()))
        return
    if args.sched:
        print(json.dumps(sched_counts()))
        return
    pin = os.cpu_count() is not None and os.cpu_count() >= 2 and bool(subprocess.run(
        ["which", "taskset"], capture_output=True).stdout)
    if pin:
        os.sched_setaffinity(0, {1})
    targets = args.targets.split(",") + (["baseline"] if args.baseline else [])
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    runs: dict[str, list[dict[str, dict[str, float]]]] = {t: [] for t in targets}
    for rep in range(args.reps):
        order = targets[rep % len(targets):] + targets[: rep % len(targets)]
        for target in order:
            runs[target].append(bench(target, args.seconds, pin, args.baseline))
    table = ["| server | seq p50 µs | seq p99 µs | seq calls/s | 16 clients calls/s | 64 clients calls/s | 64 p50 ms "
             "| server CPU µs/call (seq / 64) |",
             "|---|---|---|---|---|---|---|---|"]
    medians: dict[str, dict[str, dict[str, float]]] = {}
    for target in targets:
        med: dict[str, dict[str, float]] = {}
        for clients in ("1", "16", "64"):
            med[clients] = {k: statistics.median(r[clients][k] for r in runs[target])
                            for k in ("calls_per_s", "p50_us", "p99_us", "cpu_us_per_call", "reply_head_bytes",
                                      "reply_body_bytes")}
        medians[target] = med
        table.append(f"| {target} | {med['1']['p50_us']:.0f} | {med['1']['p99_us']:.0f} | "
                     f"{med['1']['calls_per_s']:.0f} | {med['16']['calls_per_s']:.0f} | "
                     f"{med['64']['calls_per_s']:.0f} | {med['64']['p50_us'] / 1000:.1f} | "
                     f"{med['1']['cpu_us_per_call']:.0f} / {med['64']['cpu_us_per_call']:.0f} |")
    text = "\n".join(table)
    print(text)
    for name in ("agentd", "baseline"):
        if name not in medians or "floor" not in medians:
            continue
        a, f = medians[name], medians["floor"]
        print(f"{name}/floor: throughput at 64 {a['64']['calls_per_s'] / f['64']['calls_per_s']:.2f}x "
              f"(target >= 1.0x), CPU per call at 64 {a['64']['cpu_us_per_call'] / f['64']['cpu_us_per_call']:.2f}x "
              f"(target <= 1.0x), sequential p50 {a['1']['p50_us'] / f['1']['p50_us']:.2f}x (target <= 1.1x), "
              f"CPU per sequential call {a['1']['cpu_us_per_call'] / f['1']['cpu_us_per_call']:.2f}x; reply bytes "
              f"(head, body) {a['1']['reply_head_bytes']:.0f}, {a['1']['reply_body_bytes']:.0f} / floor "
              f"{f['1']['reply_head_bytes']:.0f}, {f['1']['reply_body_bytes']:.0f}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if "agentd" in medians and "sdk" in medians:
        a, s = medians["agentd"], medians["sdk"]
        tput = a["64"]["calls_per_s"] / s["64"]["calls_per_s"]
        cpu_sdk = s["64"]["cpu_us_per_call"] / a["64"]["cpu_us_per_call"]
        print(f"agentd/sdk throughput at 64: {tput:.2f}x (target >= 2x); CPU per call sdk/agentd at 64 {cpu_sdk:.2f}x")
        if "sdk-uvicorn" in medians:
            best = medians["sdk-uvicorn"]["64"]["calls_per_s"]
            print(f"agentd/sdk-uvicorn throughput at 64: {a['64']['calls_per_s'] / best:.2f}x (target > 1x)")
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
