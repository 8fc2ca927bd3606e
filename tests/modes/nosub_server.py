"""A test peer whose server cannot push resource updates (no ``resources.subscribe`` in either era).

Run as a program: ``python tests/modes/nosub_server.py``; prints ``LISTENING <url>``. Built on the official
SDK's ``MCPServer`` with subscriptions disabled. Side door: ``POST /_test/bump?uri=test://polled`` changes the
resource's content (a JSON counter) without notifying anyone, so only polling can see it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if not __package__:  # run as a script: make the repository importable for the shared peer plumbing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.peers.servers.uvicorn_peer import serve_app

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
    await serve_app(app)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
