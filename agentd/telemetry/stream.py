"""The daemon's live event stream: every event line (the stderr vocabulary) plus ``tree.node`` changes,
fanned out to the ``/events`` WebSocket subscribers.

The bus sits on the root's event sink, like the report recorder, and never blocks it: each subscriber has a
bounded buffer, and a subscriber that falls behind loses the oldest lines it has not read (it is told how
many in a ``stream.dropped`` message) instead of slowing the daemon. A new subscriber first gets the daemon's
latest :data:`STICKY` lines (``journal.opened``: written before anyone could subscribe), a snapshot of the
newest nodes, the *held* lines (what waits for a person now, :meth:`EventBus.hold`, each drawn afresh), then
the live lines.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

import trio

if TYPE_CHECKING:  # built with the first line published: a daemon that serves nothing never loads it
    from agentd.telemetry.report import Recorder

EVENTS_PATH: Final = "/events"
#: Lines a subscriber may have unread before the oldest are dropped.
SUBSCRIBER_BUFFER: Final = 1024
#: Nodes a new subscriber gets as its snapshot.
SNAPSHOT_NODES: Final = 200
#: Open ``/events`` subscribers per daemon; more are refused.
MAX_SUBSCRIBERS: Final = 16
#: Events whose latest line every new subscriber gets first (they describe the daemon, not a moment).
STICKY: Final = frozenset({"journal.opened"})


class Subscriber:
    """One ``/events`` subscriber's bounded buffer of unread lines."""

    __slots__ = ("_ready", "accepts", "dropped", "queue")

    def __init__(self, accepts: Callable[[Mapping[str, Any]], bool] | None = None) -> None:
        self.queue: deque[Mapping[str, Any]] = deque(maxlen=SUBSCRIBER_BUFFER)
        self.dropped = 0
        self._ready = trio.Event()
        #: Which lines this subscriber may see (a served principal: its own runs'); None: every line.
        self.accepts = accepts

    def offer(self, line: Mapping[str, Any]) -> None:
        if self.accepts is not None and not self.accepts(line):
            return
        if len(self.queue) == self.queue.maxlen:
            self.dropped += 1
        self.queue.append(line)
        self._ready.set()

    async def next_batch(self) -> list[Mapping[str, Any]]:
        """Wait for lines, then take everything buffered (a ``stream.dropped`` note first if any were lost)."""
        while not self.queue:
            self._ready = trio.Event()
            await self._ready.wait()
        batch: list[Mapping[str, Any]] = []
        if self.dropped:
            batch.append({"event": "stream.dropped", "count": self.dropped})
            self.dropped = 0
        batch.extend(self.queue)
        self.queue.clear()
        return batch


class EventBus:
    """The fan-out of the root's event lines to the subscribers. (A plain class: a once run builds it at start-up, where an attrs class costs about a millisecond of CPU.)"""

    __slots__ = ("_held", "_recorder", "_sticky", "_subscribers")

    def __init__(self) -> None:
        self._recorder: Recorder | None = None
        self._subscribers: set[Subscriber] = set()
        self._sticky: dict[str, Mapping[str, Any]] = {}
        self._held: dict[str, Callable[[], Mapping[str, Any]]] = {}

    @property
    def recorder(self) -> Recorder:
        """The run tree the published lines describe (``tree.node`` changes, a new subscriber's snapshot)."""
        if self._recorder is None:
            from agentd.telemetry.report import Recorder

            self._recorder = Recorder()
        return self._recorder

    def publish(self, line: Mapping[str, Any]) -> None:
        """The sink side: record the line, hand it (and a node change) to every subscriber."""
        event = line.get("event")
        if event in STICKY:
            self._sticky[event] = line
        node = self.recorder.observe(line)
        for subscriber in self._subscribers:
            subscriber.offer(line)
            if node is not None:
                subscriber.offer(node)

    def hold(self, key: str, line: Callable[[], Mapping[str, Any]]) -> None:
        """Publish ``line()`` and offer it afresh to every new subscriber until :meth:`release` (a state that
        lasts, like an approval waiting for a person: a page opened later shows it, with its time so far)."""
        self._held[key] = line
        self.publish(line())

    def release(self, key: str, line: Mapping[str, Any]) -> None:
        """Stop holding ``key``'s line, and publish ``line`` (what ended it)."""
        if self._held.pop(key, None) is not None:
            self.publish(line)

    @property
    def full(self) -> bool:
        return len(self._subscribers) >= MAX_SUBSCRIBERS

    @contextmanager
    def subscribe(self, accepts: Callable[[Mapping[str, Any]], bool] | None = None) -> Iterator[Subscriber]:
        """A new subscriber; with ``accepts`` it is offered only the lines (sticky and snapshot included)
        that ``accepts`` lets through, decided as each line is published."""
        subscriber = Subscriber(accepts)
        for line in self._sticky.values():
            subscriber.offer(line)
        for node in self.recorder.nodes(SNAPSHOT_NODES):
            subscriber.offer(node)
        for held in self._held.values():
            subscriber.offer(held())
        self._subscribers.add(subscriber)
        try:
            yield subscriber
        finally:
            self._subscribers.discard(subscriber)


_CURRENT: ContextVar[EventBus | None] = ContextVar("agentd_event_bus", default=None)


def current_bus() -> EventBus | None:
    return _CURRENT.get()


@contextmanager
def use_bus(bus: EventBus) -> Iterator[EventBus]:
    token = _CURRENT.set(bus)
    try:
        yield bus
    finally:
        _CURRENT.reset(token)
