"""What the daemon watches, and the one pump that fans the pool's updates out.

The MCP pool delivers every ``resources/updated`` on one receive channel. The :class:`Watcher` owns
that channel: it routes updates of *routed* URIs (``--subscribe``, ``--continue``, self-tool
subscriptions) to the router, and wakes any ``await_resource`` waiting on the URI. It also owns the
subscriptions themselves: a URI is subscribed on the pool when its first reason to watch appears and
unsubscribed when its last one goes, so an ``await_resource`` on an already watched URI costs nothing
and never drops the operator's subscription.

A URI whose server did not advertise ``resources.subscribe`` degrades to polling ``resources/read``
every ``poll_interval`` seconds (a content change counts as an update), with a ``reactive.degraded``
warning; without a poll interval it is :class:`SubscribeUnsupported` (the daemon exits 2).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio

from agentd.errors import ConfigError, ResourceNotFound
from agentd.modes.condition import Condition, document_of
from agentd.modes.selftools import AwaitOutcome
from agentd.telemetry.events import EventLog, null_log

#: Bound on unsubscribe/cleanup work that runs under cancellation (shielded).
CLEANUP_TIMEOUT = 2.0
#: The digest of a resource that does not exist (appearing is a change, as disappearing is).
MISSING = "missing"
#: Subscribes (or unsubscribes) in flight at once when many URIs are armed or dropped together: each
#: arm is three round trips (read, subscribe, read), so a thousand URIs one at a time take seconds. Each
#: one in flight holds an HTTP/1.1 connection, and httpx's pool costs CPU per request in proportion to those.
ARM_CONCURRENCY = 8


class Origin(enum.Enum):
    """Why a URI is watched. Everything but AWAIT routes updates to wakes."""

    CONFIG = "config"  # --subscribe
    CONTINUE = "continue"  # --continue
    SELF = "self"  # the subscribe self-tool
    AWAIT = "await"  # an await_resource in progress


class SubscribeUnsupported(ConfigError):
    """The owning server cannot push updates for this URI and polling is off (exit 2)."""


class ResourceContentsLike(Protocol):
    @property
    def server(self) -> str: ...
    @property
    def contents(self) -> Sequence[Mapping[str, Any]]: ...


class UpdateLike(Protocol):
    @property
    def server(self) -> str: ...
    @property
    def uri(self) -> str: ...


class ResourcePool(Protocol):
    """The slice of the MCP pool the reactive part uses (``agentd.client``)."""

    async def subscribe(self, uri: str, server: str | None = None) -> bool:
        """True when the server will push updates; False when it cannot (the caller polls)."""
        ...

    async def unsubscribe(self, uri: str, server: str | None = None) -> Any: ...
    async def read_resource(self, uri: str, server: str | None = None) -> Any: ...
    def updates(self) -> trio.MemoryReceiveChannel[Any]: ...


async def read_current(pool: ResourcePool, uri: str, server: str | None) -> tuple[list[Any] | None, str | None]:
    """What a wake reads: ``uri``'s contents now (None while it does not exist) and the server that answered."""
    try:
        read = await pool.read_resource(uri, server)
    except ResourceNotFound:
        return None, server
    return list(read.contents), read.server


RouteFn = Callable[[str, "str | None"], None]


@attrs.define(eq=False)
class Watch:
    uri: str
    server: str | None
    origins: dict[Origin, int] = attrs.field(factory=dict)
    polling: bool = False
    poll_scope: trio.CancelScope | None = None
    #: Updates dispatched for this URI so far (a change pushed while it was being armed needs no synthesized one).
    dispatched: int = 0

    @property
    def routed(self) -> bool:
        return any(origin is not Origin.AWAIT for origin in self.origins)


@attrs.frozen
class WatchView:
    """A read-only row for ``agent://status``: what is watched, why, and how."""

    uri: str
    server: str | None
    origins: tuple[str, ...]
    delivery: str  # "push" or "poll"

    def to_json(self) -> dict[str, Any]:
        return {"uri": self.uri, "server": self.server, "origins": list(self.origins), "delivery": self.delivery}


def content_digest(contents: Sequence[Mapping[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(list(contents), sort_keys=True, default=str).encode()).hexdigest()


@attrs.define(eq=False)
class _Waiter:
    event: trio.Event = attrs.field(factory=trio.Event)
    seen: int = 0

    def kick(self) -> None:
        self.seen += 1
        self.event.set()

    async def next(self) -> None:
        await self.event.wait()
        self.event = trio.Event()


@attrs.define(eq=False)
class Watcher:
    pool: ResourcePool
    route: RouteFn
    poll_interval: float | None = None
    log: EventLog = attrs.field(factory=null_log)
    _watches: dict[str, Watch] = attrs.field(factory=dict, init=False)
    _waiters: dict[str, set[_Waiter]] = attrs.field(factory=dict, init=False)
    #: One lock per URI being (un)watched, with its user count: different URIs arm concurrently.
    _locks: dict[str, tuple[trio.Lock, list[int]]] = attrs.field(factory=dict, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Pump the pool's updates (and own the pollers) until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            deliver = getattr(self.pool, "deliver", None)
            if deliver is None:  # a pool that only has the channel
                updates = self.pool.updates()
                task_status.started()
                async for update in updates:
                    self.dispatch(update.uri, update.server)
                return
            # Handed over on the connection's task as they arrive: no scheduling round between a notification
            # and its wake's start (agentd.client.McpPool.deliver); dispatch never blocks.
            deliver(self.dispatch)
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                deliver(None)

    def dispatch(self, uri: str, server: str | None) -> None:
        """One update of ``uri``: route it if routed, and kick every waiter on it."""
        self.log.debug("resource.updated", uri=uri, server=server)
        watch = self._watches.get(uri)
        if watch is not None:
            watch.dispatched += 1
        if watch is not None and watch.routed:
            self.route(uri, server or watch.server)
        for waiter in self._waiters.get(uri, ()):
            waiter.kick()

    def view(self) -> list[WatchView]:
        return [
            WatchView(w.uri, w.server, tuple(o.value for o in w.origins), "poll" if w.polling else "push")
            for w in self._watches.values()
        ]

    def watching(self, uri: str, origin: Origin | None = None) -> bool:
        watch = self._watches.get(uri)
        return watch is not None and (origin is None or origin in watch.origins)

    async def watch(self, uri: str, origin: Origin, server: str | None = None, *,
                    since: str | None = None) -> str | None:
        """Add a reason to watch ``uri``; subscribes (or starts polling) on the first one.

        Nothing that changes while the subscribe is in flight is lost: the watch is registered *before*
        ``resources/subscribe`` goes out (an ``updated`` that beats the answer is routed), and for a routed
        watch the resource is read once before and once after it (level, not edge): different contents are
        one update (at least once: a resource with a ticking field earns one extra wake here).

        ``since`` (a cluster member taking a subscription over) is the digest of the contents the last wake
        read: the read after subscribing is compared with it instead, so a change made while nobody watched
        is one update too. Returns the digest read after subscribing (None when not read)."""
        async with self._locked(uri):
            watch = self._watches.get(uri)
            if watch is not None:
                watch.origins[origin] = watch.origins.get(origin, 0) + 1
                return None
            watch = Watch(uri, server, {origin: 1})
            self._watches[uri] = watch
            # An await_resource compares levels itself (its condition) and its waiter is already registered, so
            # only routed watches compare: a resource with a ticking field would otherwise end the await at once.
            compare = origin is not Origin.AWAIT
            try:
                before = await self._digest(uri, server) if compare and since is None else None
                pushed = await self.pool.subscribe(uri, server)
                if not pushed:
                    self._start_polling(watch)
            except BaseException:
                del self._watches[uri]
                raise
            self.log.info("trigger.armed", uri=uri, server=server, origin=origin.value,
                          delivery="push" if pushed else "poll")
            baseline = since if since is not None and compare else before
            after = None
            if pushed and baseline is not None:
                after = await self._digest(uri, server)
                # a change that already arrived as an update (pushed while arming) is not synthesized again
                if after is not None and after != baseline and watch.dispatched == 0:
                    self.log.info("resource.updated", uri=uri, server=server, synthesized=True,
                                  reason="changed while the subscribe was in flight" if since is None
                                  else "changed since the last wake")
                    self.dispatch(uri, server)
            return after

    async def _digest(self, uri: str, server: str | None) -> str | None:
        """The content digest of ``uri`` now ("missing" when it does not exist), or None when it cannot be read."""
        try:
            read = await self.pool.read_resource(uri, server)
        except ResourceNotFound:
            return MISSING
        except Exception:  # unreadable now: no comparison (the subscription itself still stands)
            return None
        return content_digest(read.contents)

    async def unwatch(self, uri: str, origin: Origin) -> None:
        """Drop one reason to watch ``uri``; unsubscribes when none is left."""
        async with self._locked(uri):
            watch = self._watches.get(uri)
            if watch is None or origin not in watch.origins:
                return
            watch.origins[origin] -= 1
            if watch.origins[origin] <= 0:
                del watch.origins[origin]
            if watch.origins:
                return
            del self._watches[uri]
            if watch.poll_scope is not None:
                watch.poll_scope.cancel()
                return
            try:
                await self.pool.unsubscribe(uri, watch.server)
            except Exception as exc:  # the server may be gone; the subscription dies with it
                self.log.warn("mcp.subscribe", uri=uri, action="unsubscribe", error=type(exc).__name__)

    async def forget(self, uri: str, reason: str) -> None:
        """Stop watching ``uri`` for every reason at once: its server is gone (a reload removed it). Nothing is
        unsubscribed (the connection went with the server); routed wakes and ``await_resource`` stop seeing it."""
        async with self._locked(uri):
            watch = self._watches.pop(uri, None)
        if watch is None:
            return
        if watch.poll_scope is not None:
            watch.poll_scope.cancel()
        self.log.warn("trigger.dropped", uri=uri, server=watch.server, origins=[o.value for o in watch.origins],
                      reason=reason)

    def orphans(self, servers: Mapping[str, Any], subscribed: Callable[[str], bool]) -> list[str]:
        """The watched URIs no server holds any longer: named for a server not in ``servers``, or pushed
        (not polled) with no connection ``subscribed`` to them."""
        return [w.uri for w in self._watches.values()
                if (w.server is not None and w.server not in servers) or (not w.polling and not subscribed(w.uri))]

    @contextlib.asynccontextmanager
    async def _locked(self, uri: str) -> AsyncIterator[None]:
        """Serialise (un)watching one URI; other URIs go on concurrently."""
        entry = self._locks.get(uri)
        if entry is None:
            entry = self._locks[uri] = (trio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[uri]

    async def watch_many(self, wanted: Sequence[tuple[str, Origin, str | None]]) -> None:
        """:meth:`watch` each ``(uri, origin, server)``, ``ARM_CONCURRENCY`` at a time; the first failure
        cancels the rest and is raised (as an exception group, like any nursery)."""
        limiter = trio.CapacityLimiter(ARM_CONCURRENCY)

        async def one(uri: str, origin: Origin, server: str | None) -> None:
            async with limiter:
                await self.watch(uri, origin, server)

        async with trio.open_nursery() as nursery:
            for uri, origin, server in wanted:
                nursery.start_soon(one, uri, origin, server)

    async def unwatch_all(self) -> None:
        """Drain: unsubscribe everything, bounded and shielded (the caller may be cancelled)."""
        limiter = trio.CapacityLimiter(ARM_CONCURRENCY)

        async def drop(uri: str, watch: Watch) -> None:
            async with limiter:
                for origin in list(watch.origins):
                    watch.origins[origin] = 1
                    await self.unwatch(uri, origin)

        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for uri, watch in list(self._watches.items()):
                    nursery.start_soon(drop, uri, watch)

    def _start_polling(self, watch: Watch) -> None:
        if not self.poll_interval:
            raise SubscribeUnsupported(
                f"{watch.uri}: its server does not support resources/subscribe; set --poll-interval to poll it"
            )
        assert self._nursery is not None, "Watcher.run must be started before watch()"
        self.log.warn("reactive.degraded", uri=watch.uri, server=watch.server, poll_interval=self.poll_interval,
                      reason="server did not advertise resources.subscribe")
        watch.polling = True
        watch.poll_scope = trio.CancelScope()
        self._nursery.start_soon(self._poll, watch, watch.poll_scope)

    async def _poll(self, watch: Watch, scope: trio.CancelScope) -> None:
        assert self.poll_interval
        last: str | None = None
        failing = False
        with scope:
            while True:
                try:
                    read = await self.pool.read_resource(watch.uri, watch.server)
                    digest, server = content_digest(read.contents), read.server
                except ResourceNotFound:  # gone (or not there yet) is a state too: appearing is a change
                    digest, server = MISSING, watch.server
                except Exception as exc:  # retried at the next tick; logged once per failure streak
                    if not failing:
                        self.log.warn("reactive.degraded", uri=watch.uri, error=type(exc).__name__)
                    failing = True
                    await trio.sleep(self.poll_interval)
                    continue
                failing = False
                if last is not None and digest != last:
                    self.dispatch(watch.uri, server)
                last = digest
                await trio.sleep(self.poll_interval)

    async def _read_or_none(self, uri: str) -> Sequence[Mapping[str, Any]] | None:
        """The current contents, or None while the resource does not exist (yet)."""
        try:
            read = await self.pool.read_resource(uri)
        except ResourceNotFound:
            return None
        return list(read.contents)

    async def await_resource(self, uri: str, condition: Condition | None, timeout: float) -> AwaitOutcome:
        """Block until an update of ``uri`` satisfies ``condition`` (see ``selftools``) or ``timeout``."""
        start = trio.current_time()
        waiter = _Waiter()
        self._waiters.setdefault(uri, set()).add(waiter)
        subscribed = False
        try:
            with trio.move_on_after(timeout):
                await self.watch(uri, Origin.AWAIT)
                subscribed = True
                if condition is not None:
                    # Level, not edge: a condition that already holds needs no further update.
                    contents = await self._read_or_none(uri)
                    if contents is not None and condition.holds(document_of(contents)):
                        return AwaitOutcome(uri, contents, trio.current_time() - start, 0)
                while True:
                    await waiter.next()
                    contents = await self._read_or_none(uri)
                    if contents is not None and (condition is None or condition.holds(document_of(contents))):
                        return AwaitOutcome(uri, contents, trio.current_time() - start, waiter.seen)
            return AwaitOutcome(uri, None, trio.current_time() - start, waiter.seen)
        finally:
            waiters = self._waiters.get(uri)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[uri]
            if subscribed:
                with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT):
                    await self.unwatch(uri, Origin.AWAIT)
