"""Who is subscribed to which ``agent://subagent/{handle}``, and the one-shot emission rule.

A sink is a non-blocking callable that pushes ``notifications/resources/updated{uri}`` onto one peer's
stream (a legacy session's GET stream or one modern ``subscriptions/listen`` stream). When a run turns
terminal, :meth:`Subscriptions.fire` calls every sink holding its URI once and forgets them. The one
other ``updated`` is a warm session's turn end (:meth:`Subscriptions.notify`): the sinks are called and
kept, so one subscription follows the whole session until its terminal ``fire``. Never to a peer that did
not subscribe.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import attrs

Sink = Callable[[str], None]


class SubscriptionLimit(Exception):
    """The peer already holds the most subscriptions allowed."""


@attrs.define(eq=False)
class Subscriptions:
    max_per_peer: int = 64
    _by_uri: dict[str, dict[Hashable, Sink]] = attrs.field(factory=dict)
    _by_peer: dict[Hashable, set[str]] = attrs.field(factory=dict)

    def add(self, peer: Hashable, uri: str, sink: Sink) -> None:
        uris = self._by_peer.setdefault(peer, set())
        if uri not in uris and len(uris) >= self.max_per_peer:
            raise SubscriptionLimit(f"subscription limit reached ({self.max_per_peer} per peer)")
        uris.add(uri)
        self._by_uri.setdefault(uri, {})[peer] = sink

    def remove(self, peer: Hashable, uri: str) -> None:
        self._by_peer.get(peer, set()).discard(uri)
        sinks = self._by_uri.get(uri)
        if sinks is not None:
            sinks.pop(peer, None)
            if not sinks:
                del self._by_uri[uri]

    def drop_peer(self, peer: Hashable) -> None:
        for uri in self._by_peer.pop(peer, set()):
            sinks = self._by_uri.get(uri)
            if sinks is not None:
                sinks.pop(peer, None)
                if not sinks:
                    del self._by_uri[uri]

    def fire(self, uri: str) -> int:
        """Notify every subscriber of ``uri`` once, then consume those subscriptions."""
        sinks = self._by_uri.pop(uri, {})
        for peer, sink in sinks.items():
            self._by_peer.get(peer, set()).discard(uri)
            sink(uri)
        return len(sinks)

    def notify(self, uri: str) -> int:
        """Notify every subscriber of ``uri`` and keep the subscriptions (a warm session's turn end)."""
        sinks = self._by_uri.get(uri, {})
        for sink in list(sinks.values()):
            sink(uri)
        return len(sinks)

    def count(self, peer: Hashable | None = None) -> int:
        if peer is None:
            return sum(len(s) for s in self._by_uri.values())
        return len(self._by_peer.get(peer, ()))
