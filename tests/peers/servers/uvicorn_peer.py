"""What the SDK test peers share: their command line, and serving an ASGI app with uvicorn on a bound socket.

Standard library and uvicorn only, so both the 2.x peers (agentd's venv) and the 1.x peer (its own venv, run as a
script) can import it: as ``tests.peers.servers.uvicorn_peer`` from the repository, or as ``uvicorn_peer`` when a
peer runs as a script from this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from typing import Any

import uvicorn


def parse_peer_args(description: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--mode", choices=["stateful", "stateless", "json"], default="stateful")
    p.add_argument("--tools", type=int, default=0, help="extra filler tools")
    p.add_argument("--page-size", type=int, default=0, help="page size of tools/list and resources/list (0 = all)")
    p.add_argument("--instructions", default=None)
    return p.parse_args(argv)


async def serve_app(app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve ``app`` until cancelled; print ``LISTENING <url>`` once uvicorn accepts connections."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit TCP_NODELAY; without it uvicorn's separate header/body writes meet the client's
    # delayed ACK and every response stalls ~40 ms.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            raise SystemExit("server exited before it started")
        await asyncio.sleep(0.01)  # real time: uvicorn has no start event; the launcher bounds this peer's start
    print(f"LISTENING http://{host}:{bound}/mcp", flush=True)
    await task
