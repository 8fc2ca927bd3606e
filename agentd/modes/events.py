"""MCP events as wakes: each ``--on-event`` subscription's occurrences, routed like resource updates, and its
cursor kept so that a restart neither loses nor repeats one.

Why it exists: a reactive daemon wakes on events (agentd.mcp.events) with the same debounce, coalescing and
wake caps as on resource updates, so occurrences go through the same :class:`~agentd.modes.router.Router`,
under the subscription's key (``event:SERVER/NAME``). The router says *when* a wake runs; this module holds
*what* it carries: the occurrences delivered since the last wake (polled, streamed, or POSTed by webhook:
agentd.client.event_webhook, where the daemon serves HTTPS) (at most ``EVENT_PENDING_MAX``; past that the
oldest are dropped and the wake reports a gap, as it does for the server's ``truncated``). A wake takes them all.

Durability (``--state-dir``): a subscription's cursor is journaled (daemon state, :data:`EVENT_CURSORS`) only
where everything before it has woken the agent:

* an answer with no occurrences moves the cursor while nothing is pending or waking (a quiet subscription's
  cursor stays fresh, so the events that happen while agentd is down are replayed after a restart), journaled at
  most every ``EVENT_CURSOR_SAVE_INTERVAL`` (an older cursor only replays a stretch without occurrences);
* a wake first journals which run carries which cursor (``pending``), and once the run has ended the cursor
  after its occurrences. After a crash the run's own journal decides: a wake whose run began is resumed by the
  daemon (agentd.modes.entry), so polling goes on from after its occurrences; one that never began is
  replayed from the cursor before them. Each occurrence wakes the agent once, none twice.

Without ``--state-dir`` cursors live in memory: a restart starts from now.

With ``--cluster`` (``shared``) each subscription is a cluster row owned by one member at a time
(agentd.modes.clustered): :meth:`EventRoute.arm` only checks the subscriptions, and the owner loop calls
:meth:`EventRoute.start` / :meth:`EventRoute.stop` as the member takes or loses one. The cursor lives in the row:
a wake records the cursor after its occurrences (fenced) before its run starts, and is not run when the record is
refused; a quiet stretch advances it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import trio

from agentd import defaults
from agentd.client.event_webhook import EventWebhook
from agentd.client.events import (
    EventPoller,
    EventStream,
    EventsUnsupported,
    Request,
    list_event_types,
    subscribable,
)
from agentd.config.model import EventSubscriptionConfig
from agentd.journal.errors import JournalError
from agentd.journal.store import JournalStore
from agentd.mcp import events
from agentd.modes.shared import Shared
from agentd.telemetry.events import EventLog, null_log
from agentd.transport.webhook_app import WebhookReceiver

#: Daemon-state namespace: per subscription key, ``{"cursor": ..., "pending": {"run": ..., "cursor": ...}}``.
EVENT_CURSORS: Final = "reactive.event_cursors"

RouteFn = Callable[[str, "str | None"], None]


@attrs.frozen
class Taken:
    """What one wake carries for one subscription."""

    key: str
    server: str
    name: str
    occurrences: tuple[events.Occurrence, ...]
    #: The server reported skipped events (``truncated``), or agentd dropped some over its bound.
    gap: bool
    dropped: int
    #: The cursor after these occurrences (journaled once the wake's run has ended).
    cursor: str | None


@attrs.define(eq=False)
class _Sub:
    config: EventSubscriptionConfig
    key: str
    committed: str | None = None
    pending: list[events.Occurrence] = attrs.field(factory=list)
    pending_cursor: str | None = None
    gap: bool = False
    dropped: int = 0
    waking: int = 0
    #: The running delivery's scope (cancelled when another cluster member takes the subscription).
    scope: trio.CancelScope | None = None
    #: The subscription's connection (what :meth:`EventRoute.start` delivers on).
    conn: Any = None
    delivery: str = "poll"
    #: When a quiet cursor was last journaled (trio time; None: never).
    saved_at: float | None = None
    poller: EventPoller | EventStream | EventWebhook | None = None


@attrs.define(eq=False)
class EventRoute:
    """Arm with :meth:`arm` (inside the daemon's nursery); wakes :meth:`take` and then :meth:`started` /
    :meth:`done`."""

    #: The daemon's MCP pool (its ``connections`` by server name).
    pool: Any
    notify: RouteFn
    log: EventLog = attrs.field(factory=null_log)
    state: JournalStore | None = None
    pending_max: int = defaults.EVENT_PENDING_MAX
    save_interval: float = defaults.EVENT_CURSOR_SAVE_INTERVAL
    #: ``--cluster``: subscriptions are owned (and cursors recorded) through the cluster's rows.
    shared: Shared | None = None
    #: Where webhook deliveries arrive (agentd serves HTTPS); None: no subscription can be delivered by webhook.
    webhooks: WebhookReceiver | None = None
    _subs: dict[str, _Sub] = attrs.field(factory=dict, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)

    def owns(self, key: str) -> bool:
        return key in self._subs

    @property
    def keys(self) -> list[str]:
        return list(self._subs)

    def view(self) -> list[dict[str, Any]]:
        """Rows for ``agent://status``."""
        return [{"server": s.config.server, "event": s.config.event, "key": s.key, "pending": len(s.pending),
                 "delivery": s.delivery, "delivering": s.poller is not None,
                 "polls": s.poller.polls if s.poller is not None else 0} for s in self._subs.values()]

    async def arm(self, subscriptions: Sequence[EventSubscriptionConfig], nursery: trio.Nursery) -> None:
        """Check every subscription (exit 2 on the first that cannot be delivered), restore its cursor, then
        start its delivery (``--cluster``: the owner loop starts each one this member holds). Nothing is polled
        before all were checked."""
        checked: list[tuple[EventSubscriptionConfig, Any, str]] = []
        listings: dict[str, list[events.EventType]] = {}  # one events/list per server, however many subscriptions
        for sub in subscriptions:
            conn = self._connection(sub.server)
            if sub.server not in listings:
                listings[sub.server] = await list_event_types(self._request(conn), server=sub.server, era=conn.era,
                                                              capabilities=conn.capabilities,
                                                              timeout=conn.config.call_timeout)
            checked.append((sub, conn, self._delivery(sub, listings[sub.server])))
        self._nursery = nursery
        for sub, conn, delivery in checked:
            key = events.subscription_key(sub.server, sub.event, sub.arguments)
            self._subs[key] = _Sub(sub, key, conn=conn, delivery=delivery)
        if self.shared is not None:  # the member holding a subscription's lease delivers it
            self.shared.attach_events(self)
            return
        saved = await self._saved()
        for key in list(self._subs):
            cursor, resumed = await self._restored(saved.get(key))
            self._start(key, cursor, resumed)

    def _delivery(self, sub: EventSubscriptionConfig, listed: list[events.EventType]) -> str:
        """How ``sub`` is delivered: the one its config asks for, else push, poll, webhook in that order of
        preference, among what the server offers (webhook only where agentd serves HTTPS)."""
        callback = self.webhooks is not None and self.webhooks.base_url is not None
        what = f"--on-event {sub.shown}"
        if sub.delivery == "webhook" and not callback:
            raise EventsUnsupported(f"{what}: delivery: webhook needs agentd to serve HTTPS (--serve-mcp "
                                    "https://... with --serve-cert and --serve-key): the server calls it back there")
        kind = subscribable(listed, server=sub.server, event=sub.event, webhook=callback)
        if sub.delivery is not None:
            if sub.delivery not in kind.delivery:
                offered = ", ".join(sorted(kind.delivery)) or "none"
                raise EventsUnsupported(f"{what}: delivery: {sub.delivery} is not offered for this event (the "
                                        f"server offers: {offered})")
            return sub.delivery
        for mode in ("push", "poll", "webhook"):
            if mode in kind.delivery:
                return mode
        raise AssertionError("subscribable() returned an event type agentd cannot receive")

    def declared(self) -> list[tuple[str | None, str]]:
        """``(server, key)`` of every subscription, for the cluster's rows."""
        return [(s.config.server, key) for key, s in self._subs.items()]

    def start(self, key: str, cursor: str | None) -> None:
        """Deliver ``key`` from ``cursor`` here (a cluster member took the subscription)."""
        self._start(key, cursor, None)

    def stop(self, key: str) -> None:
        """Stop delivering ``key`` here; its pending occurrences are the next owner's (replayed from the cursor
        recorded last)."""
        sub = self._subs[key]
        if sub.scope is not None:
            sub.scope.cancel()
        sub.scope, sub.poller = None, None
        sub.pending, sub.gap, sub.dropped, sub.saved_at = [], False, 0, None
        self.log.info("trigger.dropped", uri=key, server=sub.config.server, origins=["config"],
                      reason="another cluster member owns this event subscription now")

    def _start(self, key: str, cursor: str | None, resumed: str | None) -> None:
        assert self._nursery is not None, "EventRoute.arm must run first"
        sub = self._subs[key]
        if sub.scope is not None:
            sub.scope.cancel()
        sub.committed, sub.pending, sub.gap, sub.dropped, sub.saved_at = cursor, [], False, 0, None
        config, conn = sub.config, sub.conn
        on_batch = functools.partial(self._on_batch, sub)
        poller: EventPoller | EventStream | EventWebhook
        if sub.delivery == "push":
            poller = EventStream(conn.exchange, config.server, config.event, config.arguments, on_batch,
                                 cursor=cursor, log=self.log)
        elif sub.delivery == "webhook":
            assert self.webhooks is not None
            poller = EventWebhook(self._request(conn), self.webhooks, config.server, config.event, config.arguments,
                                  on_batch, cursor=cursor, timeout=conn.config.call_timeout, log=self.log)
        else:
            poller = EventPoller(self._request(conn), config.server, config.event, config.arguments, on_batch,
                                 cursor=cursor, timeout=conn.config.call_timeout, log=self.log)
        sub.poller = poller
        scope = sub.scope = trio.CancelScope()
        self.log.info("trigger.armed", trigger="event", uri=key, server=config.server, event_type=config.event,
                      delivery=sub.delivery, cursor="restored" if cursor is not None else "now",
                      **({"resumed_wake": resumed} if resumed else {}))

        async def deliver() -> None:
            with scope:
                await poller.run()

        self._nursery.start_soon(deliver)

    def _connection(self, server: str) -> Any:
        conn = self.pool.connections.get(server)
        if conn is None:
            known = ", ".join(self.pool.connections) or "none"
            raise EventsUnsupported(f"--on-event {server}:...: no connected MCP server named {server!r} "
                               f"(connected: {known})")
        return conn

    @staticmethod
    def _request(conn: Any) -> Request:
        async def request(method: str, params: dict[str, Any]) -> dict[str, Any]:
            result: dict[str, Any] = await conn.exchange.request(method, params)
            return result

        return request

    async def _saved(self) -> dict[str, Any]:
        if self.state is None:
            return {}
        try:
            return await self.state.get_state(EVENT_CURSORS)
        except JournalError as exc:
            self.log.warn("journal.write_failed", namespace=EVENT_CURSORS, error=str(exc))
            return {}

    async def _restored(self, saved: Any) -> tuple[str | None, str | None]:
        """The cursor to poll from after a restart, and the run id of a wake that carries the occurrences
        before it (the daemon resumes that run)."""
        if not isinstance(saved, Mapping):
            return None, None
        cursor = saved.get("cursor") if isinstance(saved.get("cursor"), str) else None
        pending = saved.get("pending")
        if isinstance(pending, Mapping) and isinstance(pending.get("run"), str) and await self._began(pending["run"]):
            after = pending.get("cursor")
            return (after if isinstance(after, str) else None), pending["run"]
        return cursor, None

    async def _began(self, run_id: str) -> bool:
        assert self.state is not None
        from agentd.journal.recorder import rebuild

        try:
            prior = await self.state.read_run(run_id)
        except JournalError:
            return False
        return prior is not None and rebuild(prior).started is not None

    async def _on_batch(self, sub: _Sub, result: events.PollResult) -> None:
        """One poll answer: occurrences (or a gap) are pending for a wake; a quiet answer moves the journaled
        cursor when nothing is pending or waking."""
        for item in result.events:
            if item.cut is not None:
                self.log.warn("events.data_cut", server=sub.config.server, event_type=item.name, event_id=item.event_id,
                              chars=item.cut, limit=events.MAX_DATA_CHARS)
        if result.events or result.truncated:
            sub.pending.extend(result.events)
            over = len(sub.pending) - self.pending_max
            if over > 0:
                del sub.pending[:over]
                sub.dropped += over
                sub.gap = True
            sub.gap = sub.gap or result.truncated
            sub.pending_cursor = result.cursor
            self.log.info("events.received", server=sub.config.server, event_type=sub.config.event, uri=sub.key,
                          count=len(result.events), truncated=result.truncated, pending=len(sub.pending))
            self.notify(sub.key, sub.config.server)
            return
        if not sub.pending and not sub.waking and not sub.gap and result.cursor != sub.committed:
            sub.committed = result.cursor
            now = trio.current_time()
            if sub.saved_at is None or now - sub.saved_at >= self.save_interval:
                sub.saved_at = now
                if self.shared is not None:
                    await self.shared.record_event(sub.key, result.cursor, wake=False)
                else:
                    await self._put(sub.key, {"cursor": result.cursor})

    def take(self, key: str) -> Taken | None:
        """Everything pending for ``key`` (None when nothing is: an earlier wake took it)."""
        sub = self._subs[key]
        if sub.poller is None:  # not delivered here (another cluster member owns it)
            return None
        if not sub.pending and not sub.gap:
            return None
        taken = Taken(key, sub.config.server, sub.config.event, tuple(sub.pending), sub.gap, sub.dropped,
                      sub.pending_cursor)
        sub.pending, sub.gap, sub.dropped = [], False, 0
        sub.waking += 1
        return taken

    async def fenced(self, taken: Taken) -> bool:
        """``--cluster``: record the cursor after the wake's occurrences under this member's lease before the
        run; False (the wake must not run here) when another member owns the subscription now."""
        return self.shared is None or await self.shared.record_event(taken.key, taken.cursor, wake=True)

    async def started(self, taken: Taken, run_id: str) -> None:
        """The wake's run is about to start under ``run_id``: journal which cursor it carries."""
        if self.shared is not None:
            return  # recorded in the cluster's row (:meth:`fenced`)
        sub = self._subs[taken.key]
        await self._put(taken.key, {"cursor": sub.committed, "pending": {"run": run_id, "cursor": taken.cursor}})

    async def done(self, taken: Taken, *, ran: bool) -> None:
        """The wake ended: its run ended (``ran``), so the cursor after its occurrences is journaled; or it
        never started (draining): the occurrences are left to the next start, replayed from the last cursor."""
        sub = self._subs[taken.key]
        sub.waking -= 1
        if not ran:
            return
        sub.committed = taken.cursor
        if self.shared is None:
            await self._put(taken.key, {"cursor": taken.cursor})

    async def _put(self, key: str, value: dict[str, Any]) -> None:
        if self.state is None:
            return
        try:
            await self.state.put_state(EVENT_CURSORS, {key: value})
        except JournalError as exc:  # the daemon goes on; a restart may replay these occurrences
            self.log.warn("journal.write_failed", namespace=EVENT_CURSORS, error=str(exc))

