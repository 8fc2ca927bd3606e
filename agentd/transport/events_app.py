"""``/events``: the daemon's event lines and ``tree.node`` changes as WebSocket text frames (one JSON object each).

Mounted for ``websocket`` scopes only: the HTTP server upgrades ``GET /events`` with ``Upgrade: websocket`` and
nothing else (an upgrade elsewhere stays plain HTTP, and a plain ``GET /events`` is the listener's 404). The
gate is the listener's (:mod:`agentd.transport.gate`; the ``/ui/`` page's session cookie counts as the bearer);
refused (HTTP 403 before the handshake) without it, when the daemon has no stream, has enough subscribers
(one OAuth principal: a quarter of them) or is draining. A principal sees the lines of its own runs only
(agentd.transport.tenancy); an operator sees every line. A drain closes the stream with 1001.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import trio

from agentd import defaults
from agentd.telemetry.stream import MAX_SUBSCRIBERS, Subscriber, current_bus
from agentd.transport.asgi import Receive, Scope, Send, cancel_on_event, request_headers
from agentd.transport.gate import Gate
from agentd.transport.tenancy import Owners, Principal
from agentd.transport.ui_app import with_session

#: ``/events`` subscribers one OAuth principal may hold at once (a quarter of the daemon's).
EVENTS_PER_PRINCIPAL: Final = max(1, MAX_SUBSCRIBERS // defaults.SERVE_SESSIONS_PER_OWNER_DIVISOR)
#: How long the closing frame may take once the stream is over (the peer may be gone).
CLOSE_TIME: Final = 1.0


class EventsApp:
    """The ``/events`` WebSocket; ``draining`` closes open streams (1001) and refuses new ones."""

    def __init__(self, gate: Gate, owners: Owners, draining: trio.Event) -> None:
        self.gate = gate
        self.owners = owners
        self.draining = draining
        self._by_principal: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        bus = current_bus()
        headers = with_session(request_headers(scope), self.gate.bearer)  # the /ui/ page's login cookie, if any
        verdict = None if self.gate.trust(headers) is not None else await self.gate.authenticate(headers)
        principal = verdict if isinstance(verdict, Principal) else None
        mine = self._by_principal.get(principal.key, 0) if principal is not None else 0
        refused = principal is None or bus is None or bus.full or self.draining.is_set() \
            or (principal.bounded and mine >= EVENTS_PER_PRINCIPAL)  # one principal cannot take every slot
        message = await receive()
        if message.get("type") != "websocket.connect" or refused or bus is None or principal is None:
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "websocket.accept"})
        owners, who = self.owners, principal

        def accepts(line: Mapping[str, Any]) -> bool:  # a principal sees the lines of its own runs only
            return owners.sees_line(who, line)

        key = principal.key
        self._by_principal[key] = mine + 1
        try:
            with bus.subscribe(None if principal.operator else accepts) as subscriber:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_on_close, receive, nursery.cancel_scope)
                    nursery.start_soon(cancel_on_event, self.draining, nursery.cancel_scope)
                    nursery.start_soon(_pump, subscriber, send)
        finally:
            left = self._by_principal.get(key, 1) - 1
            if left:
                self._by_principal[key] = left
            else:
                self._by_principal.pop(key, None)
        with trio.move_on_after(CLOSE_TIME, shield=True):
            try:
                await send({"type": "websocket.close", "code": 1001 if self.draining.is_set() else 1000})
            except Exception:
                pass  # the peer is gone already


async def _pump(subscriber: Subscriber, send: Send) -> None:
    """Send the subscriber's lines as they come; a peer that went away ends it (the close watcher reports it)."""
    try:
        while True:
            for line in await subscriber.next_batch():
                await send({"type": "websocket.send", "text": json.dumps(line, default=str)})
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        return


async def _cancel_on_close(receive: Receive, scope: trio.CancelScope) -> None:
    """Read (and ignore) what the subscriber sends until it closes; then stop its stream."""
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            scope.cancel()
            return


__all__ = ["EVENTS_PER_PRINCIPAL", "EventsApp"]
