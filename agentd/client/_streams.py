"""The server-push side of a connection: the legacy standing GET stream, the pinger (both eras), the modern
``subscriptions/listen`` loop; and the timings of the liveness and reconnect machinery.

It exists so every long-lived stream (what the live phase of a connection runs in its nursery) is in one
place. Messages it reads go to the :class:`~agentd.client.exchange.Exchange`'s dispatch; what to listen to
comes from, and acknowledgements go back to, the :class:`~agentd.client.subscriptions.Subscriptions`; a
stream that finds the server gone reports it to the :class:`~agentd.client.liveness.Liveness`.
"""

from __future__ import annotations

import math
import random
from contextlib import AsyncExitStack
from typing import Any

import attrs
import trio

from agentd.backoff import exponential
from agentd.client.exchange import DEFAULT_RETRY, Exchange, SessionGone, StreamBroke
from agentd.client.liveness import Liveness
from agentd.client.subscriptions import Subscriptions
from agentd.config.model import McpServerConfig
from agentd.errors import McpError, McpProtocolError, McpRpcError, McpTransportError
from agentd.mcp import jsonrpc, meta
from agentd.mcp.streamable_http import LAST_EVENT_ID, Body
from agentd.mcp.versions import Era
from agentd.telemetry.events import EventLog
from agentd.transport.http_client import ConnectionLost


@attrs.frozen
class Tuning:
    """Timings of the liveness and reconnect machinery (defaults from the design; tests shorten them)."""

    ping_interval: float = 30.0
    ping_timeout: float = 10.0
    ping_misses: int = 3
    backoff_initial: float = 0.5
    backoff_max: float = 30.0


def backoff_delay(attempt: int, tuning: Tuning, rng: random.Random) -> float:
    """Attempt 0 is immediate; then initial·2^(n-1), capped, with 50-100 % jitter."""
    if attempt <= 0:
        return 0.0
    return exponential(attempt, tuning.backoff_initial, tuning.backoff_max) * rng.uniform(0.5, 1.0)


@attrs.define(eq=False)
class PushStreams:
    """The streams a server pushes on, for one connection."""

    config: McpServerConfig
    exchange: Exchange
    liveness: Liveness
    subscriptions: Subscriptions
    log: EventLog
    tuning: Tuning
    rng: random.Random
    #: Whether the legacy server answered the GET stream with SSE (None: not tried on this session).
    stream_offered: bool | None = None
    _listen_ended: bool = False
    _listen_dropped: bool = False

    @property
    def name(self) -> str:
        return self.config.name

    def wants_get(self) -> bool:
        """Legacy: is there anything the server could push on a standing GET stream?"""
        s = self.exchange.session
        return s.tools_list_changed() or s.resources_list_changed() or s.can_subscribe()

    # -- legacy streams and liveness ---------------------------------------------------------------------

    async def get_stream(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The standing GET stream: server-to-client messages, resumed with Last-Event-ID when it closes."""
        started = False
        last_id: str | None = None
        retry: float = DEFAULT_RETRY
        try:
            while True:
                headers = self.exchange.headers_for(None, get=True)
                if last_id is not None:
                    headers[LAST_EVENT_ID] = last_id
                try:
                    async with AsyncExitStack() as stack:
                        # The first open is bounded: a server that never answers the GET must not stall connect.
                        with trio.move_on_after(math.inf if started else self.config.connect_timeout) as opening:
                            reply = await stack.enter_async_context(
                                self.exchange.transport.open("GET", headers, had_session=self.exchange.session_id is not None)
                            )
                        if opening.cancelled_caught:
                            self.log.warn("mcp.stream", server=self.name, offered=None, error="no answer to GET")
                            started = True
                            task_status.started()
                            await trio.sleep(retry)
                            continue
                        if reply.kind is Body.SESSION_GONE:
                            self.liveness.mark_broken("the server forgot the session (404 on GET)")
                            return
                        if reply.kind is not Body.SSE:
                            self.stream_offered = False
                            self.log.info("mcp.stream", server=self.name, offered=False, status=reply.status)
                            return
                        self.stream_offered = True
                        self.log.debug("mcp.stream", server=self.name, offered=True, resumed=last_id is not None)
                        if not started:
                            started = True
                            task_status.started()
                        while (message := await reply.receive()) is not None:
                            await self.exchange.dispatch(message)
                        last_id = reply.last_event_id or last_id
                        if reply.retry_ms is not None:
                            retry = reply.retry_ms / 1000
                except ConnectionLost as exc:
                    self.liveness.mark_broken(str(exc))
                    return
                except McpProtocolError as exc:
                    self.log.warn("mcp.protocol_error", server=self.name, what=f"GET stream: {exc}")
                except McpTransportError as exc:
                    self.liveness.mark_broken(str(exc))
                    return
                await trio.sleep(retry)
        finally:
            if not started:
                task_status.started()

    async def pinger(self) -> None:
        """After ``ping_interval`` with nothing from the server, ask it something cheap, bounded by
        ``ping_timeout``; ``ping_misses`` unanswered in a row mark the connection stale (broken: it reconnects).

        The legacy wire asks ``ping``. The 2026-07-28 wire removed ``ping`` (and has no session whose loss a
        404 would reveal), so an idle modern connection asks ``server/discover`` instead: every modern server
        must answer it, it is stateless and has no side effect, and an answer proves what a ping would (the
        endpoint is there and speaks). Any answer counts, an error one too; a listen stream's notifications
        and every response are activity, so a busy connection is never asked.
        """
        method = "server/discover" if self.exchange.session.era is Era.MODERN else "ping"
        last_ping = trio.current_time()
        misses = 0
        while True:
            await trio.sleep_until(max(self.exchange.activity, last_ping) + self.tuning.ping_interval)
            if max(self.exchange.activity, last_ping) + self.tuning.ping_interval > trio.current_time():
                continue
            last_ping = trio.current_time()
            try:
                with trio.fail_after(self.tuning.ping_timeout):
                    await self.exchange.request_once(method, None)
                misses = 0
            except McpRpcError:
                misses = 0  # an error answer is still an answer
            except (trio.TooSlowError, McpError, SessionGone) as exc:
                misses += 1
                self.log.warn("mcp.ping_missed", server=self.name, misses=misses, error=str(exc) or "timeout")
                if misses >= self.tuning.ping_misses:
                    self.log.error("mcp.stale", server=self.name, misses=misses)
                    self.liveness.mark_broken(f"stale: {misses} pings unanswered")
                    return
            last_ping = trio.current_time()

    # -- modern listen -----------------------------------------------------------------------------------

    async def listen_loop(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep one ``subscriptions/listen`` open; a new filter opens a new stream, then closes the old.

        A stream that drops abruptly is re-opened with backoff and then every watched URI gets one
        synthesized update; a stream that cannot be opened (refused, no ack in time) is retried with backoff.
        """
        started = False
        failures = 0
        synthesize = False
        current: trio.CancelScope | None = None
        try:
            async with trio.open_nursery() as streams:
                while True:
                    self.subscriptions.listen_changed = trio.Event()
                    self._listen_dropped = False
                    self._listen_ended = False
                    want = self.subscriptions.listen_filter()
                    scope: trio.CancelScope | None = None
                    failed = False
                    if want is not None:
                        try:
                            with trio.fail_after(self.config.connect_timeout):
                                scope = await streams.start(self._one_listen, want)
                        except ConnectionLost as exc:
                            self.liveness.mark_broken(str(exc))
                            return
                        except (McpError, trio.TooSlowError) as exc:
                            failed = True
                            self.log.warn("mcp.subscribe_degraded", server=self.name,
                                          error=f"listen: {exc or 'no acknowledgement in time'}")
                    if not failed:
                        if current is not None:
                            current.cancel()
                        current = scope
                    self.subscriptions.listen_settled()
                    if not started:
                        started = True
                        task_status.started()
                    if scope is not None and synthesize:
                        synthesize = False
                        self.subscriptions.synthesize()
                    if failed:
                        failures += 1
                        with trio.move_on_after(backoff_delay(failures, self.tuning, self.rng)):
                            await self.subscriptions.listen_changed.wait()
                        continue
                    opened_at = trio.current_time()
                    await self.subscriptions.listen_changed.wait()
                    if self._listen_ended:
                        # Ended on its own (abruptly, or with the final frame): re-listen with backoff; a stream
                        # that lived long resets the backoff.
                        if trio.current_time() - opened_at > self.tuning.backoff_max:
                            failures = 0
                        failures += 1
                        synthesize = synthesize or self._listen_dropped
                        current = None
                        await trio.sleep(backoff_delay(failures, self.tuning, self.rng))
                    else:
                        failures = 0
        finally:
            if not started:
                task_status.started()

    async def _one_listen(
        self, want: dict[str, Any], *, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """One listen stream until it ends or its scope is cancelled.

        A stream that breaks before its acknowledgement is re-issued once at once under a new id (2026-07-28
        has no resumability); a second break is a transport error (the loop retries with backoff).
        """
        with trio.CancelScope() as scope:
            graceful = False
            for attempt in range(2):
                request = self.exchange.session.request("subscriptions/listen", {"notifications": want})
                started = False
                opened = False
                try:
                    async with self.exchange.transport.open("POST", self.exchange.headers_for(request), jsonrpc.dumps(request)) as reply:
                        opened = True
                        if reply.kind is Body.HTTP_ERROR:
                            error = await reply.error_body()
                            if error is not None:
                                raise self.exchange.rpc_error(error, request)
                            raise McpTransportError(f"subscriptions/listen: HTTP {reply.status}", server=self.name)
                        if reply.kind not in (Body.SSE, Body.JSON):
                            raise McpProtocolError(f"subscriptions/listen: HTTP {reply.status}", server=self.name)
                        first = await reply.receive()
                        if first is None:
                            raise StreamBroke("the stream ended before the acknowledgement", request.id)
                        self._check_ack(first, request, want)
                        started = True
                        task_status.started(scope)
                        while (message := await reply.receive()) is not None:
                            self.exchange.activity = trio.current_time()
                            if isinstance(message, jsonrpc.Notification):
                                if meta.subscription_of(message.params or {}) == request.id:
                                    self.exchange.on_notification(message.method, message.params or {})
                            elif (isinstance(message, jsonrpc.Response | jsonrpc.ErrorResponse)
                                  and message.id == request.id):  # fmt: skip
                                graceful = True
                                break
                    break
                except ConnectionLost as exc:
                    if started:
                        self.log.warn("mcp.stream", server=self.name, listen="dropped", error=str(exc))
                        break
                    if not opened:
                        raise  # refused: the server may be gone (the loop reconnects)
                    broke = StreamBroke(str(exc), request.id)
                except StreamBroke as exc:
                    broke = exc
                except McpError as exc:
                    if not started:
                        raise
                    self.log.warn("mcp.stream", server=self.name, listen="dropped", error=str(exc))
                    break
                finally:
                    self.exchange.session.pending.pop(request.id, None)
                if attempt:
                    raise McpTransportError(
                        f"subscriptions/listen: the stream broke before the acknowledgement, again after re-issuing "
                        f"it under a new id ({broke.detail})",
                        server=self.name,
                    )
                self.log.warn("mcp.stream", server=self.name, listen="reissued", request_id=request.id,
                              error=broke.detail)  # fmt: skip
        if not scope.cancelled_caught:
            self._listen_ended = True
            self._listen_dropped = not graceful
            self.log.info("mcp.stream", server=self.name, listen="ended", graceful=graceful)
            self.subscriptions.listen_changed.set()

    def _check_ack(self, first: jsonrpc.Message | None, request: jsonrpc.Request, want: dict[str, Any]) -> None:
        if isinstance(first, jsonrpc.ErrorResponse):
            raise self.exchange.rpc_error(first, request)
        if not (isinstance(first, jsonrpc.Notification) and first.method == "notifications/subscriptions/acknowledged"):
            raise McpProtocolError("subscriptions/listen: the first frame is not the acknowledgement", server=self.name)
        params = first.params or {}
        honored = params.get("notifications") if isinstance(params.get("notifications"), dict) else {}
        assert isinstance(honored, dict)
        granted = honored.get("resourceSubscriptions") or []
        self.subscriptions.acked = {uri for uri in granted if isinstance(uri, str)}
        for uri in want.get("resourceSubscriptions", []):
            if uri not in granted:
                self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="not acknowledged by listen")
        self.log.info("mcp.stream", server=self.name, listen="acknowledged", notifications=honored)
