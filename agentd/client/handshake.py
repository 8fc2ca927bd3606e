"""How a connection learns its server's era: ``initialize`` (legacy), or ``server/discover`` when the server
refuses it the modern way or the era cache already knows the origin is modern-only; and the orderly
session close.

A server's ``era:`` (``--mcp-era``) narrows this: ``auto`` is the probe above; ``legacy`` sends only
``initialize`` (a modern refusal is the connect error, no switch); ``modern`` sends ``server/discover`` from
the first request and never ``initialize``. Only ``auto`` reads or writes the era cache, so a pinned era never
changes how another ``auto`` connection to the same origin starts.

It exists so the era probe, with its fallbacks and the era cache, reads as one story. It drives the
:class:`~agentd.client.exchange.Exchange` (whose session records the era and capabilities) and returns
what the server said about itself as a :class:`Handshake` value.
"""

from __future__ import annotations

import attrs

from agentd.client.era_cache import EraCache
from agentd.client.errors import ResponseStreamBroken
from agentd.client.exchange import Exchange, StreamBroke
from agentd.config.model import EraChoice
from agentd.defaults import MCP_ERA
from agentd.errors import McpConnectError, McpError, McpRpcError
from agentd.mcp import jsonrpc, types
from agentd.mcp import meta as mcp_meta
from agentd.mcp.client_session import HandshakeError
from agentd.mcp.versions import MODERN_VERSIONS, Era
from agentd.telemetry.events import EventLog
from agentd.transport.http_client import ConnectionLost


class NotModern(Exception):
    """A cached modern-only verdict did not hold: probe again with ``initialize``."""


@attrs.frozen
class Handshake:
    """What the server said about itself (the era, version and capabilities live in the session)."""

    server_info: types.Implementation | None = None
    instructions: str | None = None
    #: ``server/discover``'s ``ttlMs`` (modern only).
    discover_ttl_ms: int | None = None


def connect_error(exchange: Exchange, what: str) -> McpConnectError:
    return McpConnectError(
        f"MCP server {exchange.name!r} ({exchange.transport.display_url}): {what}", server=exchange.name
    )


async def handshake(exchange: Exchange, eras: EraCache, log: EventLog, era: EraChoice = MCP_ERA) -> Handshake:
    """Probe the era (or speak the configured one) and complete the handshake on ``exchange``'s (reset) session.

    Raises:
        McpConnectError: the server refused or failed the handshake.
    """
    session = exchange.session
    if era == "modern":
        return await _discover(exchange, eras, log, None, pinned=True)
    if era == "auto" and eras.modern(exchange.transport.url) is not None:
        # The origin is known to be modern-only (this connection or an earlier one in the process learnt
        # it): skip the refused initialize. If discover says otherwise, the entry is dropped and we probe.
        try:
            return await _discover(exchange, eras, log, None)
        except NotModern:
            session.reset()
    request = session.start_initialize()
    try:
        result = await exchange.roundtrip(request)
    except McpRpcError as exc:
        refusal = jsonrpc.ErrorResponse(None, exc.code, exc.rpc_message, exc.data)
        if era == "auto" and session.modern_refusal(refusal):
            return await _discover(exchange, eras, log, exc)
        if session.modern_refusal(refusal):
            raise connect_error(exchange, f"initialize was refused the 2026-07-28 way ({exc}) and the server's era "
                                          "is set to legacy (era: auto or modern would speak 2026-07-28)") from None
        raise connect_error(exchange, f"initialize was refused: {exc}") from None
    try:
        init = session.complete_initialize(result)
    except HandshakeError as exc:
        raise connect_error(exchange, str(exc)) from None
    log.info("mcp.era", server=exchange.name, era="legacy", protocol_version=init.protocol_version,
             **({"configured": True} if era == "legacy" else {}))  # fmt: skip
    await exchange.post(session.initialized_notification())
    return Handshake(init.server_info, init.instructions)


async def _discover(
    exchange: Exchange, eras: EraCache, log: EventLog, refusal: McpRpcError | None, *, pinned: bool = False
) -> Handshake:
    """Switch to the modern wire: the server refused ``initialize`` the way a 2026-07-28 server does, or
    (``refusal`` None) the era cache says its origin is modern-only, or (``pinned``) the server's era is modern.

    Raises:
        NotModern: the cached verdict did not hold (the entry is dropped; probe with initialize).
        McpConnectError: anything else.
    """
    session = exchange.session
    failure: McpError | HandshakeError
    for attempt in range(2):
        request = session.start_discover()
        try:
            result = await exchange.roundtrip(request)
            found = session.adopt_modern(result)
            break
        except StreamBroke as exc:
            if attempt == 0:
                log.warn("mcp.stream", server=exchange.name, method=request.method, reissued=True,
                         request_id=request.id, error=exc.detail)  # fmt: skip
                continue
            failure = exchange.stream_broken(request.method, exc, reissued=True)
        except McpRpcError as exc:
            if attempt == 0 and _offers_ours(exc):
                # -32022 naming a version we speak: the server rejected this attempt, not the version; once more.
                log.info("mcp.era", server=exchange.name, era=None, retry="server/discover", error=str(exc))
                continue
            failure = exc
        except (McpError, HandshakeError) as exc:
            failure = exc
        # A network failure (refused, reset, broken twice) is no verdict about the era.
        no_verdict = isinstance(failure, ConnectionLost | ResponseStreamBroken)
        if pinned:
            raise connect_error(exchange, f"server/discover failed ({failure}); the server's era is set to modern "
                                          "(era: auto or legacy would send initialize)") from None
        if refusal is None and not no_verdict:
            if eras.forget(exchange.transport.url):
                log.info("mcp.era", server=exchange.name, era=None, cache="dropped", error=str(failure))
            raise NotModern()
        if refusal is None:
            raise connect_error(exchange, f"server/discover failed ({failure})") from None
        raise connect_error(
            exchange, f"initialize was refused ({refusal}) and server/discover failed too ({failure})"
        ) from None
    assert session.protocol_version is not None
    if not pinned:
        eras.record_modern(exchange.transport.url, session.protocol_version)
    meta = found.extra.get("_meta")
    info = (meta.get(mcp_meta.SERVER_INFO) if isinstance(meta, dict) else None) or found.extra.get("serverInfo")
    try:
        server_info = types.structure(info, types.Implementation) if info else None
    except types.WireError:
        server_info = None
    log.info("mcp.era", server=exchange.name, era="modern", protocol_version=session.protocol_version,
             cached=refusal is None and not pinned, **({"configured": True} if pinned else {}))  # fmt: skip
    return Handshake(server_info, found.instructions, found.ttl_ms)


def _offers_ours(exc: McpRpcError) -> bool:
    """A -32022 whose ``data.supported`` names a modern version agentd speaks."""
    supported = exc.data.get("supported") if isinstance(exc.data, dict) else None
    return (exc.code == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION and isinstance(supported, list)
            and any(v in MODERN_VERSIONS for v in supported))


async def close_session(exchange: Exchange, log: EventLog) -> None:
    """DELETE the legacy session on an orderly close (a 405 just means the server keeps no sessions)."""
    if exchange.session.era is Era.LEGACY and exchange.session_id is not None:
        headers = exchange.headers_for(None, get=True)
        try:
            await exchange.transport.delete(headers)
        except McpError:
            pass
        log.info("mcp.closed", server=exchange.name)
    exchange.session_id = None
