"""Polling one MCP event subscription: ``events/list`` to check it, then ``events/poll`` at the server's pace.

Why it exists: the events extension (agentd.mcp.events) moves subscriptions to the client: with poll delivery
the server holds no state, and the client asks, cursor in hand, for what happened since. :class:`EventPoller`
is that loop for one subscription, over any ``request`` function (the connection's
:class:`~agentd.client.exchange.Exchange`, which adds the 2026-07-28 envelope, the extension in the per-request
client capabilities and the required headers): it polls, hands each answer to ``on_batch`` (which decides what
a wake is, agentd.modes.events), and sleeps the server's ``nextPollMs`` (kept within a floor and a cap; at
once while ``hasMore``). Every request is bounded by the call timeout; a failing poll (the server down, a
malformed answer) is logged once per streak (``events.poll_failed``) and retried with a doubling backoff, the
cursor unchanged: nothing is skipped and nothing crashes.

:class:`EventStream` is push delivery, for an event type the server offers by ``push``: one long-lived
``events/stream`` request whose response stream carries the subscription's ``notifications/events/*``; every
frame that moves the cursor goes to ``on_batch`` as a poll answer would. A stream that ends, breaks, or stays
silent (no event and no heartbeat) for ``EVENT_STREAM_QUIET`` is re-opened from the cursor, with the same
doubling backoff when it fails.

:func:`list_event_types` and :func:`subscribable` are the start-up check: the server speaks the 2026-07-28 wire,
declares the extension, lists the event type and offers it by poll or push (or webhook, where agentd serves
HTTPS: agentd.client.event_webhook); each miss is an
:class:`EventsUnsupported` (exit 2).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from agentd import defaults
from agentd.client.exchange import Exchange
from agentd.errors import ConfigError, McpError, McpProtocolError, McpTransportError
from agentd.mcp import events, jsonrpc, meta
from agentd.mcp.client_session import ResultTypeError, SessionError
from agentd.mcp.streamable_http import Body
from agentd.mcp.versions import Era
from agentd.telemetry.events import EventLog, null_log

#: ``request(method, params)``: one request on the subscription's server, answered with its result.
Request = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
#: Told of every good poll answer (on the poller's task), before the poller sleeps.
OnBatch = Callable[[events.PollResult], Awaitable[None]]


class EventsUnsupported(ConfigError):
    """The server cannot deliver the event agentd was asked to wake on (exit 2, before any wake)."""


async def list_event_types(request: Request, *, server: str, era: Era | None, capabilities: Mapping[str, Any],
                           timeout: float) -> list[events.EventType]:
    """Every event type ``server`` lists (``events/list``, every page up to ``MAX_LIST_PAGES``);
    :class:`EventsUnsupported` when it does not speak the extension or cannot list them."""
    what = f"--on-event {server}:..."
    if era is not Era.MODERN:
        raise EventsUnsupported(f"{what}: the server speaks the 2025-11-25 protocol; MCP events need the "
                                "2026-07-28 protocol (server/discover)")
    if not events.offered(capabilities):
        raise EventsUnsupported(f"{what}: the server does not declare the events extension "
                                f"({events.EXTENSION}) in server/discover")
    cursor: str | None = None
    listed: list[events.EventType] = []
    for _ in range(events.MAX_LIST_PAGES):
        try:
            with trio.fail_after(timeout):
                result = await request("events/list", events.list_params(cursor))
            page, cursor = events.parse_list(result)
        except trio.TooSlowError:
            raise EventsUnsupported(f"{what}: events/list: no answer within {timeout:g} s") from None
        except ResultTypeError as exc:
            raise EventsUnsupported(f"{what}: {exc}") from None
        except McpError as exc:
            raise EventsUnsupported(f"{what}: events/list failed: {exc}") from None
        listed += page
        if cursor is None:
            break
    return listed


def subscribable(listed: list[events.EventType], *, server: str, event: str, webhook: bool = False
                 ) -> events.EventType:
    """The event type ``event`` among those ``server`` lists; :class:`EventsUnsupported` when it is not listed or
    offered neither by poll nor by push (nor by webhook, when agentd can be called back: ``webhook``)."""
    what = f"--on-event {server}:{event}"
    for kind in listed:
        if kind.name == event:
            usable = {"poll", "push", "webhook"} if webhook else {"poll", "push"}
            if not kind.delivery & usable:
                offered = ", ".join(sorted(kind.delivery)) or "none"
                how = "poll, push or webhook" if webhook else \
                    "poll or push (webhook only where it serves HTTPS: --serve-mcp https://...)"
                raise EventsUnsupported(f"{what}: the server offers this event by {offered} only; agentd "
                                        f"receives events by {how}")
            return kind
    shown = ", ".join(kind.name for kind in listed[:20]) or "none"
    raise EventsUnsupported(f"{what}: the server lists no such event type (it lists: {shown})")


@attrs.define(eq=False)
class EventPoller:
    """One subscription's poll loop: :meth:`run` until cancelled."""

    request: Request
    server: str
    name: str
    arguments: Mapping[str, Any]
    on_batch: OnBatch
    #: Where the subscription stands (None: from now); advanced by every good answer.
    cursor: str | None = None
    timeout: float = defaults.CALL_TIMEOUT
    log: EventLog = attrs.field(factory=null_log)
    poll_default: float = defaults.EVENT_POLL_DEFAULT
    poll_floor: float = defaults.EVENT_POLL_MIN
    poll_cap: float = defaults.EVENT_POLL_MAX
    retry: float = defaults.EVENT_POLL_RETRY
    batch: int = defaults.EVENT_POLL_BATCH
    #: Good answers so far (``agent://status``, tests).
    polls: int = 0

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                result = await self.poll_once()
            except (McpError, SessionError, trio.TooSlowError) as exc:  # SessionError: between two sessions
                failures += 1
                delay = min(self.retry * 2 ** min(failures - 1, 16), self.poll_cap)
                if failures == 1:
                    error = str(exc) if isinstance(exc, McpError) else f"no answer within {self.timeout:g} s"
                    self.log.warn("events.poll_failed", server=self.server, event_type=self.name, error=error,
                                  retry_s=delay)
                await trio.sleep(delay)
                continue
            if failures:
                self.log.info("events.poll_recovered", server=self.server, event_type=self.name, failures=failures)
                failures = 0
            await self.on_batch(result)
            delay = events.poll_delay(result, default=self.poll_default, floor=self.poll_floor, cap=self.poll_cap)
            self.log.debug("events.polled", server=self.server, event_type=self.name, count=len(result.events),
                           next_poll_s=round(delay, 3))
            await trio.sleep(delay)

    async def poll_once(self) -> events.PollResult:
        """One ``events/poll`` from :attr:`cursor`; advances it. A malformed answer is
        :class:`~agentd.errors.McpProtocolError` (the cursor stays)."""
        with trio.fail_after(self.timeout):
            result = await self.request("events/poll", events.poll_params(self.name, self.arguments, self.cursor,
                                                                          self.batch))
        try:
            parsed = events.parse_poll(result, max_events=self.batch)
        except ResultTypeError as exc:
            raise McpProtocolError(f"events/poll {self.name}: {exc}", server=self.server) from None
        self.polls += 1
        self.cursor = parsed.cursor
        return parsed


@attrs.define(eq=False)
class EventStream:
    """One subscription's push stream: :meth:`run` until cancelled (re-opening the stream from the cursor)."""

    exchange: Exchange
    server: str
    name: str
    arguments: Mapping[str, Any]
    on_batch: OnBatch
    cursor: str | None = None
    log: EventLog = attrs.field(factory=null_log)
    quiet: float = defaults.EVENT_STREAM_QUIET
    retry: float = defaults.EVENT_POLL_RETRY
    cap: float = defaults.EVENT_POLL_MAX
    #: Frames that moved the cursor so far (``agent://status``, tests).
    polls: int = 0
    #: Streams opened so far.
    opened: int = 0

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self.stream_once()
                failures = 0
                delay = self.retry  # ended by the server: re-open (not in a tight loop)
            except (McpError, SessionError) as exc:  # SessionError: between two sessions (and malformed frames)
                failures += 1
                delay = min(self.retry * 2 ** min(failures - 1, 16), self.cap)
                if failures == 1:
                    self.log.warn("events.poll_failed", server=self.server, event_type=self.name, error=str(exc),
                                  retry_s=delay, delivery="push")
            await trio.sleep(delay)

    async def stream_once(self) -> None:
        """One ``events/stream`` until it ends; raises when it cannot be opened, breaks or goes quiet."""
        exchange = self.exchange
        request = exchange.session.request("events/stream", events.stream_params(self.name, self.arguments,
                                                                                 self.cursor))
        try:
            async with exchange.transport.open("POST", exchange.headers_for(request), jsonrpc.dumps(request)) as reply:
                if reply.kind is Body.HTTP_ERROR:
                    error = await reply.error_body()
                    if error is not None:
                        raise exchange.rpc_error(error, request)
                    raise McpTransportError(f"events/stream: HTTP {reply.status}", server=self.server)
                if reply.kind not in (Body.SSE, Body.JSON):
                    raise McpProtocolError(f"events/stream: HTTP {reply.status}", server=self.server)
                self.opened += 1
                while True:
                    with trio.move_on_after(self.quiet) as silent:
                        message = await reply.receive()
                    if silent.cancelled_caught:
                        raise McpTransportError(f"events/stream {self.name}: neither an event nor a heartbeat for "
                                                f"{self.quiet:g} s", server=self.server)
                    if message is None:
                        return
                    if not await self._frame(message, request):
                        return
        finally:
            exchange.session.pending.pop(request.id, None)

    async def _frame(self, message: jsonrpc.Message, request: jsonrpc.Request) -> bool:
        """Handle one message of the stream; False once the stream is over."""
        if isinstance(message, jsonrpc.ErrorResponse) and message.id == request.id:
            raise self.exchange.rpc_error(message, request)
        if isinstance(message, jsonrpc.Response) and message.id == request.id:
            return False
        if not isinstance(message, jsonrpc.Notification):
            return True
        params = message.params or {}
        if meta.subscription_of(params) not in (request.id, None):
            return True
        try:
            frame = events.stream_frame(message.method, params)
        except ResultTypeError as exc:
            raise McpProtocolError(f"events/stream {self.name}: {exc}", server=self.server) from None
        if frame is None:
            return True
        if frame.error is not None:
            self.log.warn("events.poll_failed", server=self.server, event_type=self.name, error=frame.error,
                          delivery="push", ended=frame.ended)
            return not frame.ended
        if frame.result is not None:
            if message.method == "notifications/events/active":
                self.log.debug("events.stream_active", server=self.server, event_type=self.name,
                               truncated=frame.result.truncated)
            self.polls += 1
            self.cursor = frame.result.cursor
            await self.on_batch(frame.result)
        return True
