"""Run agentd's self-MCP server in-process on 127.0.0.1 (agentd's own HTTP server, as the daemon serves it) over a test backend."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from agentd.mcp.sse import SseDecoder, SseEvent
from agentd.selfmcp.surface import AgentInfo, SelfMcpLimits, SelfMcpSurface
from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
from agentd.transport.serve import ServeConfig, Serving, serve_mcp
from tests.selfmcp.backend import TaskBackend
from tests.selfmcp.certs import Pki

ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
MODERN = "2026-07-28"


@attrs.define(eq=False)
class Served:
    url: str
    backend: TaskBackend
    surface: SelfMcpSurface
    app: McpAsgiApp
    serving: Serving
    stop: trio.Event


@asynccontextmanager
async def serving(
    *,
    pki: Pki | None = None,
    mtls: bool = False,
    bearer: str | None = None,
    limits: SelfMcpLimits | None = None,
    path: str = "/mcp",
    max_body: int = 8 * 1024 * 1024,
    header_timeout: float = 10.0,
    body_timeout: float = 30.0,
    keepalive: float = 15.0,
    reload_interval: float = 2.0,
    cert: Path | None = None,
    key: Path | None = None,
    accept_cancel: bool = False,
) -> AsyncIterator[Served]:
    scheme = "https" if pki is not None else "http"
    cfg = ServeConfig(
        url=f"{scheme}://127.0.0.1:0{path}",
        cert=cert or (pki.server.cert if pki else None),
        key=key or (pki.server.key if pki else None),
        client_ca=pki.ca if (pki and mtls) else None,
        bearer=bearer,
        header_timeout=header_timeout,
        reload_interval=reload_interval,
        max_per_client=256,  # the floods here all come from 127.0.0.1 (the per-client cap has its own tests)
    )
    async with trio.open_nursery() as nursery:
        backend = TaskBackend(nursery)
        surface = SelfMcpSurface(backend, AgentInfo(run_id="run-test", mode="loop"), limits=limits)
        await nursery.start(surface.run)
        app = McpAsgiApp(surface, AsgiOptions(paths=cfg.paths, bearer=bearer, max_body=max_body,
                                              keepalive=keepalive, body_timeout=body_timeout,
                                              accept_cancel=accept_cancel))
        stop = trio.Event()

        async def serve(task_status: trio.TaskStatus[Serving]) -> None:
            await serve_mcp(app, cfg, shutdown_trigger=stop.wait, task_status=task_status)
            nursery.cancel_scope.cancel()  # served and drained: the surface and backend go too

        info: Serving = await nursery.start(serve)
        url = f"{scheme}://127.0.0.1:{info.port}{path}"
        try:
            yield Served(url, backend, surface, app, info, stop)
        finally:
            stop.set()
            nursery.cancel_scope.deadline = trio.current_time() + 8


def rpc(method: str, params: dict[str, Any] | None = None, id: int | str | None = 1) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if id is not None:
        msg["id"] = id
    if params is not None:
        msg["params"] = params
    return msg


def modern_meta() -> dict[str, Any]:
    return {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}


def modern_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = dict(ACCEPT)
    headers["mcp-protocol-version"] = MODERN
    headers["mcp-method"] = method
    if name is not None:
        headers["mcp-name"] = name
    return headers


class LegacyPeer:
    """A raw legacy client: initialize, then POSTs carrying the session id."""

    def __init__(self, client: httpx.AsyncClient, url: str, version: str = "2025-11-25",
                 headers: dict[str, str] | None = None) -> None:
        self.client = client
        self.url = url
        self.version = version
        self.extra = headers or {}
        self.session: str | None = None
        self._id = 0

    def headers(self) -> dict[str, str]:
        out = {**ACCEPT, **self.extra}
        if self.session:
            out["mcp-session-id"] = self.session
            out["mcp-protocol-version"] = self.version
        return out

    async def initialize(self) -> dict[str, Any]:
        r = await self.client.post(self.url, headers={**ACCEPT, **self.extra}, json=rpc("initialize", {
            "protocolVersion": self.version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}, 0))
        assert r.status_code == 200, r.text
        self.session = r.headers["mcp-session-id"]
        n = await self.client.post(self.url, headers=self.headers(), json=rpc("notifications/initialized", id=None))
        assert n.status_code == 202
        return dict(r.json()["result"])

    async def post(self, method: str, params: dict[str, Any] | None = None) -> httpx.Response:
        self._id += 1
        return await self.client.post(self.url, headers=self.headers(), json=rpc(method, params, self._id))

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        r = await self.post(method, params)
        assert r.status_code == 200, (r.status_code, r.text)
        return decode_reply(r)


def decode_reply(r: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a POST, whether it came as JSON or as an SSE stream."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        events = [e for e in SseDecoder().feed(r.content) if e.data]
        return dict(json.loads(events[-1].data))
    return dict(r.json())


async def read_events(lines: AsyncIterator[bytes], decoder: SseDecoder, want: int) -> list[SseEvent]:
    out: list[SseEvent] = []
    async for chunk in lines:
        out.extend(decoder.feed(chunk))
        if len([e for e in out if e.data]) >= want:
            break
    return out
