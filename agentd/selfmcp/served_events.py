"""The served Events extension's log, kept in the journal with ``--state-dir``, and the two methods it answers.

Why it exists: the surface (agentd.selfmcp.surface) learns when a served run ends, whatever wire spawned it; this
module turns that into events (``subagent.finished``, and ``budget.exhausted`` when that is why it ended) in one
bounded log (agentd.mcp.served_events.EventLog) that a modern-wire client polls with ``events/poll`` or follows
with ``events/stream`` (:class:`EventStream`: push delivery). What waits for a person (agentd.oversight.approvals)
becomes ``approval.pending`` and, once decided, ``approval.decided`` (:meth:`ServedEvents.approvals`), each its
subagent's owner's.

A push stream holds no copy of the log: it is a position in it (its cursor) and at most one poll's worth of frames
(``MAX_EVENTS``) waiting to be written, so a slow or dead reader costs the same as a quiet one; the transport ends
a stream whose reader does not take a frame within ``SERVE_EVENTS_SEND_TIMEOUT`` (it reconnects with its last
cursor and misses nothing the log still keeps). A principal holds at most ``SERVE_EVENTS_STREAMS_PER_PRINCIPAL``
open streams, the daemon ``SERVE_EVENTS_STREAMS``; one more is the extension's ResourceExhausted.

With a journal, every event is written (one durable ``put_state`` with the log's head) before any poll can see
it, and the log is read back at start-up: a cursor handed out before an agentd restart (a SIGKILL included) goes on
where it was, no event lost, none twice. An event the previous process did not get to write (its run's end was
journaled, then the process died) is written at start-up by :meth:`ServedEvents.ensure_finished`. Without a journal
the log lives in memory only, bounded the same way (``SERVE_EVENTS_KEPT`` events, ``SERVE_EVENTS_MAX_AGE``
seconds); a cursor from before a restart then reads what is kept with ``truncated: true``.

``--cluster``: each member keeps its own log in memory (the events of the runs it watched end); a poll reaches
one member.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from agentd import defaults
from agentd.journal.errors import JournalError
from agentd.mcp import jsonrpc
from agentd.mcp import served_events as wire
from agentd.mcp.served_events import Cursor, EventLog, PollRequest, Stored
from agentd.telemetry.events import EventLog as Log
from agentd.telemetry.events import null_log
from agentd.transport.tenancy import LOCAL_KEY

if TYPE_CHECKING:
    from agentd.journal.store import JournalStore
    from agentd.oversight.approvals import Approvals, Pending

#: The journal's daemon-state namespace of the log: ``meta`` (epoch, head, floor) and ``e.<seq>`` per event.
NAMESPACE: Final = "serve.events"
_META: Final = "meta"


def _key(seq: int) -> str:
    return f"e.{seq}"


class ServedEvents:
    """The served event log; ``store`` is the journal (``--state-dir``), or None for memory only."""

    def __init__(self, store: JournalStore | None = None, *, log: Log | None = None,
                 max_kept: int = defaults.SERVE_EVENTS_KEPT, max_age: float = defaults.SERVE_EVENTS_MAX_AGE,
                 next_poll_ms: int = defaults.SERVE_EVENTS_POLL_MS, clock: Callable[[], float] = time.time,
                 heartbeat: float = defaults.SERVE_EVENTS_HEARTBEAT,
                 streams_per_principal: int = defaults.SERVE_EVENTS_STREAMS_PER_PRINCIPAL,
                 max_streams: int = defaults.SERVE_EVENTS_STREAMS) -> None:
        self.store = store
        self.log = log or null_log()
        self.clock = clock
        self.next_poll_ms = next_poll_ms
        self.heartbeat = heartbeat
        self.streams_per_principal = streams_per_principal
        self.max_streams = max_streams
        self.events = EventLog(secrets.token_hex(8), max_kept, max_age)
        self._lock = trio.Lock()
        #: Set (and replaced) each time an event becomes visible: what an idle push stream waits on.
        self.changed = trio.Event()
        #: The open push streams.
        self.open: set[EventStream] = set()

    async def load(self) -> None:
        """Read the journaled log (its epoch, so older cursors stay valid); a first start journals a new one."""
        if self.store is None:
            return
        try:
            saved = await self.store.get_state(NAMESPACE)
        except JournalError as exc:
            self.log.warn("journal.write_failed", namespace=NAMESPACE, error=str(exc))
            return
        head = saved.get(_META)
        if isinstance(head, Mapping) and isinstance(head.get("epoch"), str):
            kept = [Stored.from_json(int(k[2:]), v) for k, v in saved.items() if k.startswith("e.") and k[2:].isdigit()]
            self.events.epoch = str(head["epoch"])
            self.events.restore(_int(head.get("head")), _int(head.get("floor")), _float(head.get("floor_at")),
                                [e for e in kept if e is not None])
        async with self._lock:
            await self._write({}, self.events.trim(self.clock()))

    async def _write(self, changes: Mapping[str, Any], dropped: list[Stored]) -> None:
        if self.store is None:
            return
        body = {**changes, **{_key(e.seq): None for e in dropped},
                _META: {"epoch": self.events.epoch, "head": self.events.head, "floor": self.events.floor,
                        "floor_at": self.events.floor_at}}
        try:
            await self.store.put_state(NAMESPACE, body)
        except JournalError as exc:  # kept in memory; a restart will not see it
            self.log.warn("journal.write_failed", namespace=NAMESPACE, error=str(exc))

    async def emit(self, name: str, owner: str, data: Mapping[str, Any]) -> None:
        """Journal one event, then make it visible to polls (in sequence order: one writer at a time)."""
        async with self._lock:
            now = self.clock()
            event = self.events.append(name, owner, data, now)
            with trio.CancelScope(shield=True):  # a half-written event would leave a gap in the sequence
                await self._write({_key(event.seq): event.to_json()}, self.events.trim(now))
            self.changed.set()
            self.changed = trio.Event()

    async def finished(self, handle: str, owner: str, view: Mapping[str, Any]) -> None:
        """A served run ended (``view``: its terminal body): ``subagent.finished``, and ``budget.exhausted`` when
        that is why."""
        await self.emit(wire.SUBAGENT_FINISHED, owner, wire.finished_data(view))
        if view.get("status") == "budget_exhausted":
            await self.emit(wire.BUDGET_EXHAUSTED, owner, {"handle": handle, "status": "budget_exhausted"})
        self.log.info("serve.event", name=wire.SUBAGENT_FINISHED, handle=handle, status=view.get("status"))

    async def ensure_finished(self, handle: str, owner: str, view: Mapping[str, Any], since: float | None) -> None:
        """At start-up: a journaled run that ended (``since``: when it was spawned, wall clock) whose
        ``subagent.finished`` the previous process did not write gets it now; one it wrote is not written twice."""
        if since is not None and since <= self.events.floor_at:
            return  # its event, if any, is older than what the bounds keep
        for event in self.events.events:
            if (event.name == wire.SUBAGENT_FINISHED and event.data.get("handle") == handle
                    and (since is None or event.at >= since)):
                return
        await self.finished(handle, owner, view)

    async def approvals(self, queue: Approvals, owner_of: Callable[[str | None], str | None]) -> None:
        """Until cancelled: each item of ``queue`` is ``approval.pending`` as it starts waiting and
        ``approval.decided`` once it waits no more, owned by ``owner_of(item.path)`` (the asking subagent's
        principal; the operator's for the daemon's own runs). The watcher only queues (it must not block); this
        task journals, in order."""
        send, receive = trio.open_memory_channel[tuple[str, str, dict[str, Any]]](math.inf)

        def watch(item: Pending, waiting: bool) -> None:
            owner = owner_of(item.path) or LOCAL_KEY
            send.send_nowait((wire.APPROVAL_PENDING, owner, _pending_data(item)) if waiting
                             else (wire.APPROVAL_DECIDED, owner, _decided_data(item)))

        queue.watchers.append(watch)
        try:
            async with receive:
                async for name, owner, data in receive:
                    await self.emit(name, owner, data)
        finally:
            queue.watchers.remove(watch)

    def poll(self, params: Mapping[str, Any], visible: Callable[[str], bool]) -> dict[str, Any]:
        """One ``events/poll`` (raises :class:`agentd.mcp.served_events.PollError`)."""
        request = wire.parse_poll(params)
        return self.events.poll(request, visible, self.clock(), self.next_poll_ms)

    def open_stream(self, params: Mapping[str, Any], principal: str, visible: Callable[[str], bool],
                    subscription: jsonrpc.RequestId) -> EventStream:
        """One ``events/stream``: checked like a poll (:class:`agentd.mcp.served_events.PollError`, answered as a
        JSON-RPC error with no stream opened), counted against the stream limits (``StreamLimit``); the caller
        must :meth:`EventStream.close` it however it ends."""
        request = wire.parse_poll(params)
        mine = self.streams.get(principal, 0)
        if mine >= self.streams_per_principal:
            raise wire.StreamLimit(self.streams_per_principal)
        if len(self.open) >= self.max_streams:
            raise wire.StreamLimit(self.max_streams)
        start, truncated = self.events.start(request.cursor)
        stream = EventStream(self, principal, request, visible, subscription, start)
        stream.pending.append(wire.stream_frame("active", subscription, {
            "cursor": self.events.cursor(start), "truncated": truncated}))
        stream.read(first=True)
        self.open.add(stream)
        self.log.debug("serve.events_stream", action="open", name=request.name, streams=mine + 1)
        return stream

    @property
    def streams(self) -> dict[str, int]:
        """Open push streams by principal key."""
        counts: dict[str, int] = {}
        for stream in self.open:
            counts[stream.principal] = counts.get(stream.principal, 0) + 1
        return counts


@attrs.define(eq=False)
class EventStream:
    """One open push subscription: its position in the log and the frames read but not yet written (at most one
    read's worth: ``MAX_EVENTS`` events and an ``active`` frame)."""

    served: ServedEvents
    principal: str
    request: PollRequest
    visible: Callable[[str], bool]
    subscription: jsonrpc.RequestId
    position: int
    pending: deque[dict[str, Any]] = attrs.field(factory=deque)
    closed: bool = False

    def read(self, *, first: bool = False) -> None:
        """Queue the events after :attr:`position` (a gap the bounds made since is a fresh ``active`` with
        ``truncated: true``, as the extension says); ``maxAgeMs`` bounds only the first read (the replay)."""
        log = self.served.events
        request = attrs.evolve(self.request, cursor=Cursor(log.epoch, self.position), max_events=wire.MAX_EVENTS,
                               max_age_ms=self.request.max_age_ms if first else None)
        answer = log.poll(request, self.visible, self.served.clock(), 0)
        if answer["truncated"]:
            if first and self.pending:
                self.pending[0]["params"]["truncated"] = True  # the opening ``active`` says it
            else:
                self.pending.append(wire.stream_frame("active", self.subscription, {
                    "cursor": log.cursor(max(self.position, log.floor)), "truncated": True}))
        for occurrence in answer["events"]:
            self.pending.append(wire.stream_frame("event", self.subscription, occurrence))
        self.position = Cursor.decode(answer["cursor"]).seq

    async def next_frame(self) -> dict[str, Any]:
        """The next frame to write: a queued one, else the next events as they are emitted, else (after
        ``heartbeat`` seconds of quiet) a heartbeat carrying the position checked up to."""
        deadline = trio.current_time() + self.served.heartbeat
        while not self.pending:
            changed = self.served.changed
            self.read()
            if self.pending:
                break
            with trio.move_on_at(deadline):
                await changed.wait()
                continue
            self.read()
            if not self.pending:
                return wire.stream_frame("heartbeat", self.subscription,
                                         {"cursor": self.served.events.cursor(self.position)})
        return self.pending.popleft()

    def final(self) -> dict[str, Any]:
        return wire.stream_final(self.subscription)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pending.clear()
            self.served.open.discard(self)


def _pending_data(item: Pending) -> dict[str, Any]:
    shown = item.to_json()
    data: dict[str, Any] = {"id": item.id, "kind": item.kind, "run_id": item.run_id, "server": item.server}
    if item.path:
        data["handle"] = item.path
    if item.kind == "approval":
        data.update(tool=shown["tool"], summary=shown["arguments"])
    else:
        data.update(message=shown["message"], schema=shown["schema"])
    return data


def _decided_data(item: Pending) -> dict[str, Any]:
    decision = item.decision
    data: dict[str, Any] = {"id": item.id, "kind": item.kind, "run_id": item.run_id,
                            "action": decision.action if decision is not None else "withdrawn"}
    if item.path:
        data["handle"] = item.path
    if decision is not None and decision.reason:
        data["reason"] = decision.reason
    return data


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
