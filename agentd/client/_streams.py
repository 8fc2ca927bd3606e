"""The server-push side of a connection: the legacy GET stream and pinger, the modern listen loop.

These are methods of :class:`agentd.client.connection.ServerConnection`, kept here so each module stays
readable; the live phase of a connection runs them in its nursery. Shared timing values live here too.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from agentd.backoff import exponential
from agentd.errors import McpError, McpProtocolError, McpRpcError, McpTransportError
from agentd.mcp import jsonrpc, meta
from agentd.mcp.client_session import CapabilityMissing, ClientSession
from agentd.mcp.streamable_http import LAST_EVENT_ID, Body
from agentd.transport.http_client import ConnectionLost

if TYPE_CHECKING:
    from agentd.config.model import McpServerConfig
    from agentd.events import EventLog
    from agentd.transport.http_client import HttpTransport

MAX_PAGES: Final = 1024
#: Bound on the shielded clean-up sends (notifications/cancelled, DELETE).
CLEANUP_GRACE: Final = 2.0
#: How often a SSE response with an event id may be resumed over GET before the request fails.
RESUME_ATTEMPTS: Final = 5
DEFAULT_RETRY: Final = 1.0
#: How long to read on after a POST stream's answer so the connection can be reused.
STREAM_DRAIN_GRACE: Final = 0.05

UpdateSink = Callable[[str, str, bool], None]


@attrs.frozen
class Tuning:
    """Timings of the liveness and reconnect machinery (defaults from the design; tests shorten them)."""

    ping_interval: float = 30.0
    ping_timeout: float = 10.0
    ping_misses: int = 3
    backoff_initial: float = 0.5
    backoff_max: float = 30.0


class _SessionGone(Exception):
    """A 404 on a request that carried our session id: the server forgot the session."""


class _StreamBroke(Exception):
    """A modern response (JSON or SSE) broke or ended before its answer: re-issue it, or surface it typed."""

    def __init__(self, detail: str, request_id: jsonrpc.RequestId) -> None:
        super().__init__(detail)
        self.detail = detail
        self.request_id = request_id


@attrs.define(eq=False)
class _Waiter:
    event: trio.Event = attrs.field(factory=trio.Event)
    result: dict[str, Any] | None = None
    error: jsonrpc.ErrorResponse | None = None


def backoff_delay(attempt: int, tuning: Tuning, rng: random.Random) -> float:
    """Attempt 0 is immediate; then initial·2^(n-1), capped, with 50-100 % jitter."""
    if attempt <= 0:
        return 0.0
    return exponential(attempt, tuning.backoff_initial, tuning.backoff_max) * rng.uniform(0.5, 1.0)


class StreamsMixin:
    """Push channels of one connection. Everything it uses is defined by ``ServerConnection``."""

    if TYPE_CHECKING:
        config: McpServerConfig
        transport: HttpTransport
        log: EventLog
        on_update: UpdateSink
        tuning: Tuning
        rng: random.Random
        session: ClientSession
        session_id: str | None
        watched: dict[str, None]
        stream_offered: bool | None
        _activity: float
        _listen_changed: trio.Event
        _listen_dropped: bool
        _listen_ended: bool
        _listen_acks: int
        _listen_acked: trio.Event
        _acked: set[str]

        @property
        def name(self) -> str: ...
        def _mark_broken(self, reason: str) -> None: ...
        def _headers(self, request: jsonrpc.Request | None, *, get: bool = False) -> dict[str, str]: ...
        def _rpc_error(self, error: jsonrpc.ErrorResponse, request: jsonrpc.Request) -> McpRpcError: ...
        def _on_notification(self, method: str, params: dict[str, Any]) -> None: ...
        async def _dispatch(self, message: jsonrpc.Message) -> None: ...
        async def _request_once(
            self, method: str, params: dict[str, Any] | None, headers: dict[str, str] | None = None
        ) -> dict[str, Any]: ...

    # -- legacy streams and liveness ---------------------------------------------------------------------

    async def _get_stream(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The standing GET stream: server-to-client messages, resumed with Last-Event-ID when it closes."""
        started = False
        last_id: str | None = None
        retry: float = DEFAULT_RETRY
        try:
            while True:
                headers = self._headers(None, get=True)
                if last_id is not None:
                    headers[LAST_EVENT_ID] = last_id
                try:
                    async with AsyncExitStack() as stack:
                        # The first open is bounded: a server that never answers the GET must not stall connect.
                        with trio.move_on_after(math.inf if started else self.config.connect_timeout) as opening:
                            reply = await stack.enter_async_context(
                                self.transport.open("GET", headers, had_session=self.session_id is not None)
                            )
                        if opening.cancelled_caught:
                            self.log.warn("mcp.stream", server=self.name, offered=None, error="no answer to GET")
                            started = True
                            task_status.started()
                            await trio.sleep(retry)
                            continue
                        if reply.kind is Body.SESSION_GONE:
                            self._mark_broken("the server forgot the session (404 on GET)")
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
                            await self._dispatch(message)
                        last_id = reply.last_event_id or last_id
                        if reply.retry_ms is not None:
                            retry = reply.retry_ms / 1000
                except ConnectionLost as exc:
                    self._mark_broken(str(exc))
                    return
                except McpProtocolError as exc:
                    self.log.warn("mcp.protocol_error", server=self.name, what=f"GET stream: {exc}")
                except McpTransportError as exc:
                    self._mark_broken(str(exc))
                    return
                await trio.sleep(retry)
        finally:
            if not started:
                task_status.started()

    async def _pinger(self) -> None:
        last_ping = trio.current_time()
        misses = 0
        while True:
            await trio.sleep_until(max(self._activity, last_ping) + self.tuning.ping_interval)
            if max(self._activity, last_ping) + self.tuning.ping_interval > trio.current_time():
                continue
            last_ping = trio.current_time()
            try:
                with trio.fail_after(self.tuning.ping_timeout):
                    await self._request_once("ping", None)
                misses = 0
            except McpRpcError:
                misses = 0  # an error answer is still an answer
            except (trio.TooSlowError, McpError, _SessionGone) as exc:
                misses += 1
                self.log.warn("mcp.ping_missed", server=self.name, misses=misses, error=str(exc) or "timeout")
                if misses >= self.tuning.ping_misses:
                    self.log.error("mcp.stale", server=self.name, misses=misses)
                    self._mark_broken(f"stale: {misses} pings unanswered")
                    return
            last_ping = trio.current_time()

    async def _resubscribe(self) -> None:
        for uri in list(self.watched):
            try:
                with trio.fail_after(self.config.call_timeout):
                    await self._request_once("resources/subscribe", {"uri": uri})
                self.log.info("mcp.subscribe", server=self.name, uri=uri, resubscribe=True)
            except (McpError, trio.TooSlowError, _SessionGone, CapabilityMissing) as exc:
                self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error=str(exc))

    # -- modern listen -----------------------------------------------------------------------------------

    def _listen_filter(self) -> dict[str, Any] | None:
        want: dict[str, Any] = {}
        if self.session.tools_list_changed():
            want["toolsListChanged"] = True
        if self.session.resources_list_changed():
            want["resourcesListChanged"] = True
        if self.session.can_subscribe() and self.watched:
            want["resourceSubscriptions"] = list(self.watched)
        return want or None

    async def _listen_loop(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
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
                    self._listen_changed = trio.Event()
                    self._listen_dropped = False
                    self._listen_ended = False
                    want = self._listen_filter()
                    scope: trio.CancelScope | None = None
                    failed = False
                    if want is not None:
                        try:
                            with trio.fail_after(self.config.connect_timeout):
                                scope = await streams.start(self._one_listen, want)
                        except ConnectionLost as exc:
                            self._mark_broken(str(exc))
                            return
                        except (McpError, trio.TooSlowError) as exc:
                            failed = True
                            self.log.warn("mcp.subscribe_degraded", server=self.name,
                                          error=f"listen: {exc or 'no acknowledgement in time'}")
                    if not failed:
                        if current is not None:
                            current.cancel()
                        current = scope
                    self._listen_acks += 1
                    acked, self._listen_acked = self._listen_acked, trio.Event()
                    acked.set()
                    if not started:
                        started = True
                        task_status.started()
                    if scope is not None and synthesize:
                        synthesize = False
                        for uri in self.watched:
                            self.log.info("mcp.updated", server=self.name, uri=uri, synthesized=True)
                            self.on_update(self.name, uri, True)
                    if failed:
                        failures += 1
                        with trio.move_on_after(backoff_delay(failures, self.tuning, self.rng)):
                            await self._listen_changed.wait()
                        continue
                    opened_at = trio.current_time()
                    await self._listen_changed.wait()
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
                request = self.session.request("subscriptions/listen", {"notifications": want})
                started = False
                opened = False
                try:
                    async with self.transport.open("POST", self._headers(request), jsonrpc.dumps(request)) as reply:
                        opened = True
                        if reply.kind is Body.HTTP_ERROR:
                            error = await reply.error_body()
                            if error is not None:
                                raise self._rpc_error(error, request)
                            raise McpTransportError(f"subscriptions/listen: HTTP {reply.status}", server=self.name)
                        if reply.kind not in (Body.SSE, Body.JSON):
                            raise McpProtocolError(f"subscriptions/listen: HTTP {reply.status}", server=self.name)
                        first = await reply.receive()
                        if first is None:
                            raise _StreamBroke("the stream ended before the acknowledgement", request.id)
                        self._check_ack(first, request, want)
                        started = True
                        task_status.started(scope)
                        while (message := await reply.receive()) is not None:
                            self._activity = trio.current_time()
                            if isinstance(message, jsonrpc.Notification):
                                if meta.subscription_of(message.params or {}) == request.id:
                                    self._on_notification(message.method, message.params or {})
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
                    broke = _StreamBroke(str(exc), request.id)
                except _StreamBroke as exc:
                    broke = exc
                except McpError as exc:
                    if not started:
                        raise
                    self.log.warn("mcp.stream", server=self.name, listen="dropped", error=str(exc))
                    break
                finally:
                    self.session.pending.pop(request.id, None)
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
            self._listen_changed.set()

    def _check_ack(self, first: jsonrpc.Message | None, request: jsonrpc.Request, want: dict[str, Any]) -> None:
        if isinstance(first, jsonrpc.ErrorResponse):
            raise self._rpc_error(first, request)
        if not (isinstance(first, jsonrpc.Notification) and first.method == "notifications/subscriptions/acknowledged"):
            raise McpProtocolError("subscriptions/listen: the first frame is not the acknowledgement", server=self.name)
        params = first.params or {}
        honored = params.get("notifications") if isinstance(params.get("notifications"), dict) else {}
        assert isinstance(honored, dict)
        granted = honored.get("resourceSubscriptions") or []
        self._acked = {uri for uri in granted if isinstance(uri, str)}
        for uri in want.get("resourceSubscriptions", []):
            if uri not in granted:
                self.log.warn("mcp.subscribe_degraded", server=self.name, uri=uri, error="not acknowledged by listen")
        self.log.info("mcp.stream", server=self.name, listen="acknowledged", notifications=honored)
