"""Resource subscriptions of a connection: the watched set, ``resources/subscribe`` on the legacy wire or the
filter of the ``subscriptions/listen`` stream on the modern one, when a server cannot push an update at all,
and delivering each update (real, or synthesized after a reconnect) to the pool. Also the task ids a tool call
is waiting for (agentd.client.tasks): the modern listen filter asks for their status notifications
(``taskIds``, the tasks extension), and a notification wakes the waiting poller early; polling stays the rule.

It exists so the watched set, and the rendezvous between a ``subscribe`` call and the listen stream that
must acknowledge it, have one owner. It asks through the :class:`~agentd.client.exchange.Exchange`; the
push streams read :meth:`Subscriptions.listen_filter` and report back through :meth:`listen_settled`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import trio

from agentd.client.exchange import Exchange, SessionGone
from agentd.config.model import McpServerConfig
from agentd.errors import McpError, McpTransportError
from agentd.mcp import tasks as mcp_tasks
from agentd.mcp.client_session import CapabilityMissing
from agentd.mcp.versions import Era
from agentd.telemetry.events import EventLog

#: ``(server, uri, synthesized)``: the pool's coalescing updates queue.
UpdateSink = Callable[[str, str, bool], None]


@attrs.define(eq=False)
class Subscriptions:
    """The watched URIs of one server and how their updates reach the pool."""

    config: McpServerConfig
    exchange: Exchange
    log: EventLog
    on_update: UpdateSink
    #: Watched URIs in subscription order (a dict as an ordered set).
    watched: dict[str, None] = attrs.field(factory=dict)
    #: Set when the modern listen filter changed (or its stream ended); the listen loop replaces it.
    listen_changed: trio.Event = attrs.field(factory=trio.Event)
    #: URIs the current modern listen acknowledged.
    acked: set[str] = attrs.field(factory=set)
    _listen_acks: int = 0
    _listen_acked: trio.Event = attrs.field(factory=trio.Event)
    #: Task ids being waited for (agentd.client.tasks), each with the event a status notification sets (and
    #: replaces): asked for on the modern listen stream (``taskIds``) when the server declares the extension.
    tasks: dict[str, trio.Event] = attrs.field(factory=dict)

    @property
    def name(self) -> str:
        return self.config.name

    def can_subscribe(self) -> bool:
        return self.exchange.session.can_subscribe()

    def listen_filter(self) -> dict[str, Any] | None:
        """What the modern listen stream should ask for (None: nothing to listen to)."""
        session = self.exchange.session
        want: dict[str, Any] = {}
        if session.tools_list_changed():
            want["toolsListChanged"] = True
        if session.resources_list_changed():
            want["resourcesListChanged"] = True
        if session.can_subscribe() and self.watched:
            want["resourceSubscriptions"] = list(self.watched)
        if self.tasks and mcp_tasks.pushes_status(session.capabilities):
            want["taskIds"] = list(self.tasks)
        return want or None

    def watch_task(self, task_id: str) -> None:
        """A task is being waited for: ask for its status notifications (modern: a new listen filter)."""
        if task_id in self.tasks:
            return
        self.tasks[task_id] = trio.Event()
        if self.exchange.session.era is Era.MODERN and mcp_tasks.pushes_status(self.exchange.session.capabilities):
            self.listen_changed.set()

    def unwatch_task(self, task_id: str) -> None:
        if self.tasks.pop(task_id, None) is not None and self.exchange.session.era is Era.MODERN \
                and mcp_tasks.pushes_status(self.exchange.session.capabilities):
            self.listen_changed.set()

    def task_nudge(self, task_id: str) -> trio.Event | None:
        """What a status notification of ``task_id`` sets (None: not watched)."""
        return self.tasks.get(task_id)

    def task_status(self, params: dict[str, Any]) -> None:
        """A status notification arrived: wake the task's poller (it asks ``tasks/get`` at once)."""
        task_id = params.get("taskId")
        nudge = self.tasks.get(task_id) if isinstance(task_id, str) else None
        if nudge is not None and isinstance(task_id, str):
            self.tasks[task_id] = trio.Event()
            nudge.set()
            self.log.debug("mcp.task_pushed", server=self.name, task_id=task_id, status=params.get("status"))

    def listen_settled(self) -> None:
        """The listen loop acted on the latest filter (acknowledged, or failed): wake ``subscribe`` calls."""
        self._listen_acks += 1
        acked, self._listen_acked = self._listen_acked, trio.Event()
        acked.set()

    def updated(self, uri: str, *, synthesized: bool = False) -> None:
        self.log.info("mcp.updated", server=self.name, uri=uri, synthesized=synthesized)
        self.on_update(self.name, uri, synthesized)

    def synthesize(self) -> None:
        """One ``updated`` per watched URI: a change missed while disconnected is not lost."""
        for uri in self.watched:
            self.updated(uri, synthesized=True)

    async def subscribe(self, uri: str, *, stream_offered: bool | None) -> bool:
        """Watch ``uri``. False (and a ``mcp.subscribe_degraded`` event) when the server cannot push it.

        ``stream_offered``: whether the legacy server answered the GET stream (None: not tried).
        """
        if uri in self.watched:
            return True
        exchange = self.exchange
        era = exchange.session.era
        if not exchange.session.can_subscribe():
            self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="no resources.subscribe")
            return False
        if era is Era.LEGACY and stream_offered is False:
            # resources/updated is not tied to a request: without the GET stream it has no way to us.
            self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="the server offers no GET stream")
            return False
        if era is Era.LEGACY and exchange.session_id is None:
            # A sessionless (stateless) server cannot tie a subscription to the stream that would carry it.
            self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="the server keeps no session")
            return False
        self.watched[uri] = None
        try:
            with trio.fail_after(self.config.call_timeout):
                if era is Era.MODERN:
                    before = self._listen_acks
                    self.listen_changed.set()
                    while self._listen_acks == before:
                        await self._listen_acked.wait()
                    if uri not in self.acked:
                        # Still watched (a later listen may take it), but the caller must poll for now.
                        self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="not acknowledged")
                        return False
                else:
                    await exchange.request("resources/subscribe", {"uri": uri})
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
        if self.exchange.session.era is Era.MODERN:
            self.listen_changed.set()
            return
        with trio.fail_after(self.config.call_timeout):
            await self.exchange.request("resources/unsubscribe", {"uri": uri})

    async def resubscribe(self) -> None:
        """Legacy, after a reconnect: subscribe every watched URI on the new session again."""
        for uri in list(self.watched):
            try:
                with trio.fail_after(self.config.call_timeout):
                    await self.exchange.request_once("resources/subscribe", {"uri": uri})
                self.log.info("mcp.subscribe", server=self.name, uri=uri, resubscribe=True)
            except (McpError, trio.TooSlowError, SessionGone, CapabilityMissing) as exc:
                self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error=str(exc))
