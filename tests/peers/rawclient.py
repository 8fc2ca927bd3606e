"""A tiny, independent MCP-over-HTTP client for checking the peers themselves (not agentd's client).

It speaks just enough of both eras to prove what a peer does on the wire: legacy sessions (initialize, session id,
POST answered by JSON or SSE) and modern single exchanges (``_meta`` envelope + headers). Tests of agentd must
use agentd's client; this exists so the peer smoke tests do not depend on the code they are meant to exercise.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio

ACCEPT = "application/json, text/event-stream"
LEGACY_VERSION = "2025-11-25"
MODERN_VERSION = "2026-07-28"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPS = "io.modelcontextprotocol/clientCapabilities"
META_INFO = "io.modelcontextprotocol/clientInfo"


def parse_sse(body: str) -> list[dict[str, Any]]:
    """JSON payloads of every ``data:`` event in an SSE body (multi-line data joined with newlines)."""
    out: list[dict[str, Any]] = []
    data: list[str] = []
    for line in [*body.splitlines(), ""]:
        if line == "":
            payload = "\n".join(data)
            data = []
            if payload.strip():  # a priming event (id only, empty data) carries no message
                out.append(json.loads(payload))
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return out


class SseReader:
    """Reads JSON-RPC messages off one streaming response; call ``until`` as often as needed.

    httpx lets a response body be iterated once, so a test that waits for several messages in turn keeps one
    reader (one underlying iterator) for the whole stream.
    """

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_text()
        self._buf = ""
        self._pending: list[dict[str, Any]] = []
        self.seen: list[dict[str, Any]] = []

    async def until(self, predicate: Callable[[dict[str, Any]], bool], limit: int = 50) -> list[dict[str, Any]]:
        """Messages read up to and including the first that satisfies ``predicate``. Callers bound the wait."""
        out: list[dict[str, Any]] = []
        while True:
            while self._pending:
                msg = self._pending.pop(0)
                out.append(msg)
                self.seen.append(msg)
                if predicate(msg):
                    return out
            if len(out) > limit:
                raise AssertionError(f"no expected message among {out}")
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                raise AssertionError(f"SSE stream ended without the expected message; saw {out}") from None
            self._buf = (self._buf + chunk).replace("\r\n", "\n")
            while "\n\n" in self._buf:
                frame, self._buf = self._buf.split("\n\n", 1)
                self._pending += parse_sse(frame + "\n\n")


async def read_sse_until(
    response: httpx.Response | SseReader, predicate: Callable[[dict[str, Any]], bool], limit: int = 50
) -> list[dict[str, Any]]:
    """Read SSE messages until one satisfies ``predicate``; returns those read. Pass an ``SseReader`` to read on."""
    reader = response if isinstance(response, SseReader) else SseReader(response)
    return await reader.until(predicate, limit)


async def poke_until_seen(
    response: httpx.Response | SseReader, poke: Callable[[], Awaitable[Any]], predicate: Callable[[dict[str, Any]], bool],
    *, interval: float = 0.5,
) -> list[dict[str, Any]]:
    """Call ``poke()`` every ``interval`` seconds until the SSE stream yields a message matching ``predicate``.

    For streams whose attachment on the server is not observable (the legacy GET stream sends no first frame):
    a notification sent before the stream attached is dropped by the server, so poke again instead of sleeping
    and hoping. Callers bound the wait.
    """
    async with trio.open_nursery() as nursery:
        async def keep_poking() -> None:
            while True:
                await poke()
                await trio.sleep(interval)  # real time: the real server's stream attaches unseen; the caller bounds this

        nursery.start_soon(keep_poking)
        seen = await read_sse_until(response, predicate)
        nursery.cancel_scope.cancel()
    return seen


def messages(resp: httpx.Response) -> list[dict[str, Any]]:
    """All JSON-RPC messages in a response, JSON or SSE."""
    ctype = resp.headers.get("content-type", "")
    if ctype.startswith("text/event-stream"):
        return parse_sse(resp.text)
    if not resp.content:
        return []
    body = resp.json()
    return body if isinstance(body, list) else [body]


class RpcError(Exception):
    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {error}")
        self.status = status
        self.error = error
        self.code = error.get("code")


class LegacySession:
    """A 2025-11-25 session: ``await s.initialize()`` then ``await s.request(method, params)``."""

    def __init__(self, client: httpx.AsyncClient, url: str, *, version: str = LEGACY_VERSION) -> None:
        self.client = client
        self.url = url
        self.version = version
        self.session_id: str | None = None
        self.ids = itertools.count(1)
        self.init_result: dict[str, Any] = {}

    def headers(self) -> dict[str, str]:
        h = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if self.session_id:
            h["Mcp-Session-Id"] = self.session_id
            h["MCP-Protocol-Version"] = self.version
        return h

    async def initialize(self) -> dict[str, Any]:
        resp = await self.client.post(self.url, headers=self.headers(), json={
            "jsonrpc": "2.0", "id": next(self.ids), "method": "initialize",
            "params": {"protocolVersion": self.version, "capabilities": {},
                       "clientInfo": {"name": "peer-smoke", "version": "0"}},
        })
        self.session_id = resp.headers.get("mcp-session-id")
        self.init_result = _result(resp)
        await self.notify("notifications/initialized")
        return self.init_result

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> int:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        resp = await self.client.post(self.url, headers=self.headers(), json=msg)
        return resp.status_code

    async def request(self, method: str, params: dict[str, Any] | None = None, *, id: int | None = None
                      ) -> dict[str, Any]:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": next(self.ids) if id is None else id, "method": method}
        if params is not None:
            msg["params"] = params
        resp = await self.client.post(self.url, headers=self.headers(), json=msg)
        return _result(resp, msg["id"])

    async def list_all(self, method: str, key: str) -> tuple[list[dict[str, Any]], int]:
        """Follow ``nextCursor`` to the end; returns (items, pages)."""
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        pages = 0
        while True:
            result = await self.request(method, {"cursor": cursor} if cursor else {})
            pages += 1
            items += result[key]
            cursor = result.get("nextCursor")
            if not cursor:
                return items, pages


def modern_headers(method: str, name: str | None = None, *, version: str = MODERN_VERSION) -> dict[str, str]:
    h = {"Accept": ACCEPT, "Content-Type": "application/json", "MCP-Protocol-Version": version, "Mcp-Method": method}
    if name is not None:
        h["Mcp-Name"] = name
    return h


def modern_envelope(version: str = MODERN_VERSION) -> dict[str, Any]:
    return {META_VERSION: version, META_CAPS: {}, META_INFO: {"name": "peer-smoke", "version": "0"}}


_modern_ids = itertools.count(1000)


async def modern_request(client: httpx.AsyncClient, url: str, method: str, params: dict[str, Any] | None = None,
                         *, name: str | None = None, version: str = MODERN_VERSION) -> dict[str, Any]:
    """One 2026-07-28 exchange with a full envelope and headers; raises RpcError on a JSON-RPC error."""
    body_params = dict(params or {})
    body_params["_meta"] = {**modern_envelope(version), **body_params.get("_meta", {})}
    rid = next(_modern_ids)
    resp = await client.post(url, headers=modern_headers(method, name, version=version),
                             json={"jsonrpc": "2.0", "id": rid, "method": method, "params": body_params})
    return _result(resp, rid)


def _result(resp: httpx.Response, rid: Any = None) -> dict[str, Any]:
    msgs = messages(resp)
    for msg in msgs:
        if "result" in msg and (rid is None or msg.get("id") == rid):
            return dict(msg["result"])
    for msg in msgs:
        # Servers answer transport-level failures with id null (or, in SDK 1.x, "server-error").
        if "error" in msg:
            raise RpcError(resp.status_code, msg["error"])
    raise RpcError(resp.status_code, {"code": None, "message": f"no response in {resp.text[:500]!r}"})
