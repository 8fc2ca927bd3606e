"""The events-extension peer (tests/peers/servers/events_server.py) from a trio test: its side doors."""

from __future__ import annotations

import json
from typing import Any

import httpx


def _base(url: str) -> str:
    return url.removesuffix("/mcp")


async def emit(url: str, data: dict[str, Any] | None = None, *, count: int = 1, lost: int = 0,
               name: str = "ticket.created") -> list[str]:
    """Emit ``count`` occurrences (after ``lost`` that fall behind the retention floor at once); their ids."""
    params: dict[str, Any] = {"name": name, "data": json.dumps(data or {}), "count": count}
    if lost:
        params["lost"] = lost
    async with httpx.AsyncClient() as client:
        reply = await client.post(_base(url) + "/_test/emit", params=params)
    reply.raise_for_status()
    return list(reply.json()["eventIds"])


async def side(url: str, path: str, **params: Any) -> Any:
    async with httpx.AsyncClient() as client:
        reply = await (client.get(_base(url) + path, params=params) if path == "/_test/events"
                       else client.post(_base(url) + path, params=params))
    reply.raise_for_status()
    return reply.json()
