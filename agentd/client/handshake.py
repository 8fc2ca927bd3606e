"""How a connection learns its server's era: ``initialize`` (legacy), or ``server/discover`` when the server
refuses it the modern way or the era cache already knows the origin is modern-only; and the orderly
session close.

These are methods of :class:`agentd.client.connection.ServerConnection`, kept here so each module stays
readable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentd.client._streams import _StreamBroke
from agentd.client.era_cache import EraCache
from agentd.client.errors import ResponseStreamBroken
from agentd.config.model import McpServerConfig
from agentd.errors import McpConnectError, McpError, McpRpcError
from agentd.events import EventLog
from agentd.mcp import jsonrpc, types
from agentd.mcp import meta as mcp_meta
from agentd.mcp.client_session import ClientSession, HandshakeError
from agentd.mcp.versions import Era
from agentd.transport.http_client import ConnectionLost, HttpTransport


class _NotModern(Exception):
    """A cached modern-only verdict did not hold: probe again with ``initialize``."""



class HandshakeMixin:
    """Era probe and session close of one connection. Everything it uses is defined by ``ServerConnection``."""

    if TYPE_CHECKING:
        config: McpServerConfig
        transport: HttpTransport
        log: EventLog
        eras: EraCache
        session: ClientSession
        session_id: str | None
        server_info: types.Implementation | None
        instructions: str | None
        ttl_ms: dict[str, int | None]

        @property
        def name(self) -> str: ...
        @property
        def era(self) -> Era | None: ...
        @property
        def protocol_version(self) -> str | None: ...
        def _connect_error(self, what: str) -> McpConnectError: ...
        def _headers(self, request: jsonrpc.Request | None, *, get: bool = False) -> dict[str, str]: ...
        def _stream_broken(self, method: str, exc: _StreamBroke, *, reissued: bool) -> ResponseStreamBroken: ...
        async def _exchange(self, request: jsonrpc.Request, extra: dict[str, str] | None = None) -> dict[str, Any]: ...
        async def _post(self, message: jsonrpc.Message) -> None: ...
    async def _handshake(self) -> None:
        if self.eras.modern(self.transport.url) is not None:
            # The origin is known to be modern-only (this connection or an earlier one in the process learnt
            # it): skip the refused initialize. If discover says otherwise, the entry is dropped and we probe.
            try:
                await self._discover(None)
                return
            except _NotModern:
                self.session.reset()
        request = self.session.start_initialize()
        try:
            result = await self._exchange(request)
        except McpRpcError as exc:
            refusal = jsonrpc.ErrorResponse(None, exc.code, exc.rpc_message, exc.data)
            if self.session.modern_refusal(refusal):
                await self._discover(exc)
                return
            raise self._connect_error(f"initialize was refused: {exc}") from None
        try:
            init = self.session.complete_initialize(result)
        except HandshakeError as exc:
            raise self._connect_error(str(exc)) from None
        self.server_info = init.server_info
        self.instructions = init.instructions
        self.log.info("mcp.era", server=self.name, era="legacy", protocol_version=init.protocol_version)
        await self._post(self.session.initialized_notification())

    async def _discover(self, refusal: McpRpcError | None) -> None:
        """Switch to the modern wire: the server refused ``initialize`` the way a 2026-07-28 server does, or
        (``refusal`` None) the era cache says its origin is modern-only.

        Raises:
            _NotModern: the cached verdict did not hold (the entry is dropped; probe with initialize).
            McpConnectError: anything else.
        """
        failure: McpError | HandshakeError
        for attempt in range(2):
            request = self.session.start_discover()
            try:
                result = await self._exchange(request)
                found = self.session.adopt_modern(result)
                break
            except _StreamBroke as exc:
                if attempt == 0:
                    self.log.warn("mcp.stream", server=self.name, method=request.method, reissued=True,
                                  request_id=request.id, error=exc.detail)  # fmt: skip
                    continue
                failure = self._stream_broken(request.method, exc, reissued=True)
            except (McpError, HandshakeError) as exc:
                failure = exc
            # A network failure (refused, reset, broken twice) is no verdict about the era.
            no_verdict = isinstance(failure, ConnectionLost | ResponseStreamBroken)
            if refusal is None and not no_verdict:
                if self.eras.forget(self.transport.url):
                    self.log.info("mcp.era", server=self.name, era=None, cache="dropped", error=str(failure))
                raise _NotModern()
            if refusal is None:
                raise self._connect_error(f"server/discover failed ({failure})") from None
            raise self._connect_error(
                f"initialize was refused ({refusal}) and server/discover failed too ({failure})"
            ) from None
        assert self.protocol_version is not None
        self.eras.record_modern(self.transport.url, self.protocol_version)
        meta = found.extra.get("_meta")
        info = (meta.get(mcp_meta.SERVER_INFO) if isinstance(meta, dict) else None) or found.extra.get("serverInfo")
        try:
            self.server_info = types.structure(info, types.Implementation) if info else None
        except types.WireError:
            self.server_info = None
        self.instructions = found.instructions
        self.ttl_ms["server/discover"] = found.ttl_ms
        self.log.info("mcp.era", server=self.name, era="modern", protocol_version=self.protocol_version,
                      cached=refusal is None)  # fmt: skip

    async def _close_session(self) -> None:
        """DELETE the legacy session on an orderly close (a 405 just means the server keeps no sessions)."""
        if self.era is Era.LEGACY and self.session_id is not None:
            headers = self._headers(None, get=True)
            try:
                await self.transport.delete(headers)
            except McpError:
                pass
            self.log.info("mcp.closed", server=self.name)
        self.session_id = None

