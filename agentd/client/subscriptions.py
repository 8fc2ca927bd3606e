"""Resource subscriptions of a connection: ``resources/subscribe`` on the legacy wire, the watched set of the
``subscriptions/listen`` stream on the modern one, and when a server cannot push an update at all.

These are methods of :class:`agentd.client.connection.ServerConnection`, kept here so each module stays
readable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from agentd.config.model import McpServerConfig
from agentd.errors import McpTransportError
from agentd.events import EventLog
from agentd.mcp.client_session import ClientSession
from agentd.mcp.versions import Era


class SubscriptionsMixin:
    """Watching resources. Everything it uses is defined by ``ServerConnection``."""

    if TYPE_CHECKING:
        config: McpServerConfig
        log: EventLog
        session: ClientSession
        session_id: str | None
        watched: dict[str, None]
        stream_offered: bool | None
        _listen_changed: trio.Event
        _listen_acks: int
        _listen_acked: trio.Event
        _acked: set[str]

        @property
        def name(self) -> str: ...
        @property
        def era(self) -> Era | None: ...
        async def request(
            self, method: str, params: dict[str, Any] | None = None, *, headers: dict[str, str] | None = None
        ) -> dict[str, Any]: ...
    def can_subscribe(self) -> bool:
        return self.session.can_subscribe()

    async def subscribe(self, uri: str) -> bool:
        """Watch ``uri``. False (and a ``mcp.subscribe_degraded`` event) when the server cannot push it."""
        if uri in self.watched:
            return True
        if not self.session.can_subscribe():
            self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="no resources.subscribe")
            return False
        if self.era is Era.LEGACY and self.stream_offered is False:
            # resources/updated is not tied to a request: without the GET stream it has no way to us.
            self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="the server offers no GET stream")
            return False
        if self.era is Era.LEGACY and self.session_id is None:
            # A sessionless (stateless) server cannot tie a subscription to the stream that would carry it.
            self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="the server keeps no session")
            return False
        self.watched[uri] = None
        try:
            with trio.fail_after(self.config.call_timeout):
                if self.era is Era.MODERN:
                    before = self._listen_acks
                    self._listen_changed.set()
                    while self._listen_acks == before:
                        await self._listen_acked.wait()
                    if uri not in self._acked:
                        # Still watched (a later listen may take it), but the caller must poll for now.
                        self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="not acknowledged")
                        return False
                else:
                    await self.request("resources/subscribe", {"uri": uri})
        except trio.TooSlowError:
            del self.watched[uri]
            raise McpTransportError(f"subscribe {uri}: no answer within {self.config.call_timeout:g} s") from None
        except BaseException:
            self.watched.pop(uri, None)
            raise
        self.log.info("mcp.subscribe", server=self.name, uri=uri)
        return True

    async def unsubscribe(self, uri: str) -> None:
        if uri not in self.watched:
            return
        del self.watched[uri]
        if self.era is Era.MODERN:
            self._listen_changed.set()
            return
        with trio.fail_after(self.config.call_timeout):
            await self.request("resources/unsubscribe", {"uri": uri})
