"""A test peer whose server cannot push resource updates (no ``resources.subscribe`` in either era).

Run as a program: ``python tests/reactive/nosub_server.py``; prints ``LISTENING <url>``. Built on the official
SDK's ``MCPServer`` with subscriptions disabled. Side door: ``POST /_test/bump?uri=test://polled`` changes the
resource's content (a JSON counter) without notifying anyone, so only polling can see it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

state = {"test://polled": 0}
server: MCPServer = MCPServer("nosub", subscriptions=False)


@server.resource("test://polled", name="polled", mime_type="application/json")
def polled() -> str:
    return json.dumps(state["test://polled"])


async def bump(request: Request) -> Response:
    uri = request.query_params.get("uri", "test://polled")
    state[uri] = state.get(uri, 0) + 1
    return JSONResponse({"value": state[uri]})


async def main() -> None:
    app = server.streamable_http_app(host="127.0.0.1")
    app.router.routes.append(Route("/_test/bump", bump, methods=["POST"]))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1))
    task = asyncio.create_task(uv.serve(sockets=[sock]))
    while not uv.started:
        if task.done():
            await task
            raise SystemExit("server exited before it started")
        await asyncio.sleep(0.01)
    print(f"LISTENING http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    await task


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
