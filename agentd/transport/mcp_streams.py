"""The MCP endpoint's modern long-lived streams: ``subscriptions/listen`` and a handler's own notification stream.

A listen stream acknowledges first (the URIs and task ids the handler honoured), then carries
``notifications/resources/updated`` and ``notifications/tasks`` frames, each with its ``subscriptionId``, and a
final frame on drain. Streams are counted in total and per principal (one principal cannot take every stream).

A notification stream (``events/stream``) writes the handler's frames in order; a reader that takes no frame
within ``SERVE_EVENTS_SEND_TIMEOUT`` has its stream ended (a stalled reader holds nothing more; it reconnects
with its cursor and loses nothing), and drain sends the handler's final frame.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import trio

from agentd import defaults
from agentd.mcp import jsonrpc, meta
from agentd.mcp.jsonrpc import Request
from agentd.mcp.server_session import ServerCore, error_reply
from agentd.mcp.sse import encode_event
from agentd.mcp.streamable_http import EVENT_STREAM, accepts
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from agentd.transport.asgi import Receive, Send, cancel_on_event, send_reply
from agentd.transport.mcp_handler import McpHandler, NotificationStream
from agentd.transport.sse_response import sse_response
from agentd.transport.tenancy import LOCAL, Principal


class ModernStreams:
    """The endpoint's listen and notification streams, with their counts (``max_listens`` in total, the core's
    per-owner share for one principal)."""

    def __init__(self, handler: McpHandler, core: ServerCore, *, keepalive: float, max_listens: int,
                 log: EventLog, draining: trio.Event) -> None:
        self.handler = handler
        self.core = core
        self.keepalive = keepalive
        self.max_listens = max_listens
        self.log = log
        self.draining = draining
        self._listens = 0
        self._listens_by: dict[str, int] = {}

    async def listen(self, request: Request, headers: Mapping[str, str], receive: Receive, send: Send,
                     principal: Principal = LOCAL) -> None:
        if "accept" in headers and not accepts(headers["accept"], EVENT_STREAM):
            await send_reply(send, error_reply(406, jsonrpc.INVALID_REQUEST,
                                               "subscriptions/listen answers as text/event-stream", id=request.id).http)
            return
        notifications = (request.params or {}).get("notifications") or {}
        wanted = notifications.get("resourceSubscriptions") or [] if isinstance(notifications, dict) else None
        if not isinstance(wanted, list) or not all(isinstance(u, str) for u in wanted):
            await send_reply(send, error_reply(400, jsonrpc.INVALID_PARAMS, "resourceSubscriptions must be strings",
                                               id=request.id).http)
            return
        task_ids = notifications.get("taskIds") or []
        if not isinstance(task_ids, list) or not all(isinstance(t, str) for t in task_ids):
            await send_reply(send, error_reply(400, jsonrpc.INVALID_PARAMS, "taskIds must be strings",
                                               id=request.id).http)
            return
        if task_ids and not _declares(request.params or {}, meta.TASKS_EXTENSION):
            await send_reply(send, error_reply(400, jsonrpc.MISSING_CLIENT_CAPABILITY,
                                               "Missing required client capability", id=request.id,
                                               data={"requiredCapabilities": {"extensions": {
                                                   meta.TASKS_EXTENSION: {}}}}).http)
            return
        mine = self._listens_by.get(principal.key, 0)
        if self._listens >= self.max_listens:
            await self._refused(send, request, "", self.max_listens)
            return
        if principal.bounded and mine >= self.core.max_per_owner:  # one principal cannot take every stream
            await self._refused(send, request, " for this client", self.core.max_per_owner)
            return
        sender, receiver = trio.open_memory_channel[str | dict[str, Any]](256)

        def sink(item: str | dict[str, Any]) -> None:
            try:
                sender.send_nowait(item)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        ticket = self.handler.listen(wanted, sink, principal, task_ids=tuple(task_ids), task_sink=sink)
        core = self.core
        self._listens += 1
        self._listens_by[principal.key] = mine + 1

        def closed() -> None:
            self._listens -= 1
            left = self._listens_by.get(principal.key, 1) - 1
            if left:
                self._listens_by[principal.key] = left
            else:
                self._listens_by.pop(principal.key, None)
            self.handler.unlisten(ticket)

        async with sse_response(send, receive, keepalive=self.keepalive, closed=closed) as sse:
            await sse.send(core.listen_ack(request.id, ticket.honored, ticket.tasks if task_ids else None))
            for uri in ticket.fire_now:
                await sse.send(core.listen_updated(request.id, uri))
            for task in ticket.tasks_now:
                await sse.send(core.listen_task(request.id, task))
            with trio.CancelScope() as until_drain:
                sse.nursery.start_soon(cancel_on_event, self.draining, until_drain)
                while True:
                    item = await sse.wait(receiver.receive)
                    if isinstance(item, str):
                        await sse.send(core.listen_updated(request.id, item))
                    else:
                        await sse.send(core.listen_task(request.id, item))
            if self.draining.is_set():
                await sse.send(core.listen_final(request.id))

    async def _refused(self, send: Send, request: Request, whose: str, limit: int) -> None:
        metrics.served_request("refused")
        self.log.info("serve.refused", reason="listen_limit", status=503, limit=limit)
        await send_reply(send, error_reply(503, jsonrpc.INTERNAL_ERROR, f"listen stream limit reached{whose} ({limit})",
                                           id=request.id, headers=(("retry-after", "5"),)).http)

    async def notifications(self, stream: NotificationStream, receive: Receive, send: Send) -> None:
        """Write the handler's frames until the reader goes, the daemon drains (then the final frame) or the
        reader takes no frame within ``SERVE_EVENTS_SEND_TIMEOUT`` (a stalled reader holds nothing more)."""
        stalled = False
        async with sse_response(send, receive, keepalive=self.keepalive, closed=stream.close) as sse:
            with trio.CancelScope() as until_drain:
                sse.nursery.start_soon(cancel_on_event, self.draining, until_drain)
                while not stalled:
                    frame = await stream.next_frame()
                    with trio.move_on_after(defaults.SERVE_EVENTS_SEND_TIMEOUT):
                        await sse.send(_frame(frame))
                        continue
                    stalled = True
            if stalled:
                self.log.info("serve.stream_ended", reason="reader_stalled",
                              timeout=defaults.SERVE_EVENTS_SEND_TIMEOUT)
            elif self.draining.is_set():
                with trio.move_on_after(1):
                    await sse.send(_frame(stream.final()))


def _declares(params: Mapping[str, Any], extension: str) -> bool:
    """Does a modern request declare ``extension`` in its per-request client capabilities?"""
    envelope = params.get("_meta")
    caps = envelope.get(meta.CLIENT_CAPABILITIES) if isinstance(envelope, Mapping) else None
    extensions = caps.get("extensions") if isinstance(caps, Mapping) else None
    return isinstance(extensions, Mapping) and isinstance(extensions.get(extension), Mapping)


def _frame(frame: Mapping[str, Any]) -> bytes:
    return encode_event(json.dumps(frame, separators=(",", ":"), ensure_ascii=False, default=str))


__all__ = ["ModernStreams"]
