"""MCP events as a client: the ``events/*`` requests agentd sends and what each answer means.

Why it exists: a server speaking the events extension (``io.modelcontextprotocol/events``, SEP-3415, defined for
the 2026-07-28 wire) lets a client subscribe to things that happen upstream (a ticket filed, a build finished)
instead of asking the model to poll. agentd's reactive daemon wakes on them as it wakes on resource updates
(agentd.modes.events); the requests are sent by agentd.client.events. This module is the wire, as data:

* ``events/list`` names the event types, each with the delivery modes it offers (``poll``, ``push``,
  ``webhook``): :func:`parse_list`.
* ``events/poll`` carries one subscription (``name``, ``arguments``, ``cursor``; ``null`` = from now) and is
  answered with the occurrences since the cursor, the cursor after them, ``truncated`` (events were skipped),
  ``hasMore`` (poll again at once) and ``nextPollMs``: :func:`poll_params`, :func:`parse_poll`,
  :func:`poll_delay`.
* ``events/stream`` (push) carries the same subscription and is answered with a long-lived stream of
  ``notifications/events/*`` for it (``_meta["io.modelcontextprotocol/subscriptionId"]`` = the request's id):
  ``active`` (the starting cursor, ``truncated``), ``event`` (one occurrence and the cursor after it),
  ``heartbeat`` (the cursor checked up to), ``error`` (transient), ``terminated`` (the subscription ended):
  :func:`stream_params`, :func:`stream_frame`. Each frame that moves the cursor reads as a :class:`PollResult`.

Every request declares the extension in its per-request client capabilities (agentd.mcp.meta). A server's answer
is untrusted: a malformed one is :class:`~agentd.mcp.client_session.ResultTypeError` (never a crash), and sizes
are bounded (a cursor by :data:`MAX_CURSOR_CHARS`, one occurrence's ``data`` by :data:`MAX_DATA_CHARS`, cut
with a note). No I/O here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

from agentd.mcp.client_session import ResultTypeError
from agentd.mcp.meta import EVENTS_EXTENSION as EXTENSION

__all__ = ["EXTENSION"]
#: The longest cursor agentd keeps (and journals); a longer one is a protocol error.
MAX_CURSOR_CHARS: Final = 4096
#: The longest ``data`` (as JSON text) one occurrence carries into a wake; longer is replaced by a note.
MAX_DATA_CHARS: Final = 32_000
#: Occurrences one answer may carry (more than agentd asked for is a protocol error).
MAX_EVENTS: Final = 1000
#: Bound on an ``eventId``, an event name and a timestamp as agentd keeps them.
MAX_FIELD_CHARS: Final = 256
#: ``events/list`` pages agentd reads before it gives up on a server.
MAX_LIST_PAGES: Final = 20
DELIVERY_MODES: Final = frozenset({"poll", "push", "webhook"})


def offered(capabilities: Mapping[str, Any]) -> bool:
    """Does a server's ``server/discover`` declare the events extension?"""
    extensions = capabilities.get("extensions")
    return isinstance(extensions, Mapping) and isinstance(extensions.get(EXTENSION), Mapping)


@attrs.frozen
class EventType:
    """One entry of ``events/list``."""

    name: str
    delivery: frozenset[str]
    description: str | None = None


def list_params(cursor: str | None) -> dict[str, Any]:
    return {"cursor": cursor} if cursor is not None else {}


def parse_list(result: Mapping[str, Any]) -> tuple[list[EventType], str | None]:
    """An ``events/list`` page: its event types (malformed entries are skipped) and the next page's cursor."""
    entries = result.get("events")
    if not isinstance(entries, list):
        raise ResultTypeError("events/list: 'events' must be an array")
    types: list[EventType] = []
    for entry in entries[:MAX_EVENTS]:
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("name")
        delivery = entry.get("delivery", entry.get("deliveryModes"))
        if not isinstance(name, str) or not name or not isinstance(delivery, list):
            continue
        description = entry.get("description")
        types.append(EventType(name[:MAX_FIELD_CHARS], frozenset(d for d in delivery if d in DELIVERY_MODES),
                               description if isinstance(description, str) else None))
    cursor = result.get("nextCursor")
    return types, cursor if isinstance(cursor, str) and cursor else None


def poll_params(name: str, arguments: Mapping[str, Any], cursor: str | None, max_events: int) -> dict[str, Any]:
    """One ``events/poll``: the subscription, where it stands (``None``: from now), at most ``max_events``."""
    return {"name": name, "arguments": dict(arguments), "cursor": cursor, "maxEvents": max_events}


@attrs.frozen
class Occurrence:
    """One event that happened: its ``data`` kept as compact JSON text (bounded: :data:`MAX_DATA_CHARS`)."""

    event_id: str
    name: str
    timestamp: str
    data: str
    #: The size of ``data`` the server sent, when it was over the bound and replaced by a note.
    cut: int | None = None


@attrs.frozen
class PollResult:
    """An ``events/poll`` answer, checked."""

    events: tuple[Occurrence, ...]
    #: Where the subscription stands after these events (``None``: the event type cannot replay).
    cursor: str | None
    #: The server skipped events (a stale cursor, its retention): the model is told of a gap.
    truncated: bool = False
    has_more: bool = False
    #: The server's suggested wait before the next poll, seconds (None when it gave none).
    next_poll: float | None = None


def _field(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ResultTypeError(f"an event occurrence without a string {what}")
    return value[:MAX_FIELD_CHARS]


def occurrence(value: Any) -> Occurrence:
    """One ``EventOccurrence`` (``eventId``, ``name``, ``timestamp``, ``data``), checked and bounded."""
    if not isinstance(value, Mapping):
        raise ResultTypeError("an event occurrence must be an object")
    data = value.get("data")
    if not isinstance(data, Mapping):
        raise ResultTypeError("an event occurrence's data must be an object")
    try:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        raise ResultTypeError("an event occurrence's data is not JSON") from None
    cut = None
    if len(text) > MAX_DATA_CHARS:
        cut, text = len(text), json.dumps({"omitted": f"the event's data ({len(text)} characters) is over agentd's "
                                                      f"limit of {MAX_DATA_CHARS}; it was not kept"})
    return Occurrence(_field(value.get("eventId"), "eventId"), _field(value.get("name"), "name"),
                      _field(value.get("timestamp"), "timestamp"), text, cut)


def cursor_of(value: Any, *, where: str) -> str | None:
    """A cursor as the server gave it: a string (bounded) or null; anything else is a protocol error."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ResultTypeError(f"{where}: the cursor must be a string or null, not {type(value).__name__}")
    if len(value) > MAX_CURSOR_CHARS:
        raise ResultTypeError(f"{where}: a cursor of {len(value)} characters (agentd keeps at most "
                              f"{MAX_CURSOR_CHARS})")
    return value


def parse_poll(result: Mapping[str, Any], *, max_events: int = MAX_EVENTS) -> PollResult:
    """An ``events/poll`` answer. Raises :class:`ResultTypeError` for one agentd cannot trust: no ``events``
    array, more events than asked for, a malformed occurrence, a cursor that is not a string or null."""
    events = result.get("events")
    if not isinstance(events, list):
        raise ResultTypeError("events/poll: 'events' must be an array")
    if len(events) > max(max_events, 0):
        raise ResultTypeError(f"events/poll: {len(events)} events answer a poll for at most {max_events}")
    if "cursor" not in result:
        raise ResultTypeError("events/poll: the answer has no cursor")
    cursor = cursor_of(result.get("cursor"), where="events/poll")
    next_ms = result.get("nextPollMs")
    next_poll = next_ms / 1000 if isinstance(next_ms, int | float) and not isinstance(next_ms, bool) \
        and next_ms >= 0 else None
    return PollResult(tuple(occurrence(e) for e in events), cursor, result.get("truncated") is True,
                      result.get("hasMore") is True, next_poll)


def poll_delay(result: PollResult, *, default: float, floor: float, cap: float) -> float:
    """How long to wait before the next ``events/poll``: at once while the server has more (``hasMore``), else
    its ``nextPollMs`` kept within [floor, cap] (``default`` when it named none)."""
    if result.has_more and result.events:
        return 0.0
    wanted = result.next_poll if result.next_poll is not None else default
    return min(max(wanted, floor), cap)


def subscription_key(server: str, name: str, arguments: Mapping[str, Any]) -> str:
    """The key one subscription is routed and journaled under: ``event:SERVER/NAME``, with a digest of the
    arguments when there are any (two subscriptions to one event type with different filters are two)."""
    key = f"event:{server}/{name}"
    if arguments:
        canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
        key += "#" + hashlib.sha256(canonical.encode()).hexdigest()[:12]
    return key


STREAM_METHODS: Final = frozenset({"notifications/events/active", "notifications/events/event",
                                   "notifications/events/heartbeat", "notifications/events/error",
                                   "notifications/events/terminated"})


def stream_params(name: str, arguments: Mapping[str, Any], cursor: str | None) -> dict[str, Any]:
    """One ``events/stream``: the subscription and where it stands (``None``: from now)."""
    return {"name": name, "arguments": dict(arguments), "cursor": cursor}


@attrs.frozen
class StreamFrame:
    """One ``notifications/events/*`` frame of a stream: what it moves (``result``: None when it moves nothing),
    or the error it reports (``ended``: the subscription is over, re-open it)."""

    result: PollResult | None = None
    error: str | None = None
    ended: bool = False


def _error_text(params: Mapping[str, Any]) -> str:
    error = params.get("error")
    if isinstance(error, Mapping):
        code, message = error.get("code"), error.get("message")
        return f"{str(message)[:200] if message is not None else 'an error'} ({code})"
    return "an error without details"


def stream_frame(method: str, params: Mapping[str, Any]) -> StreamFrame | None:
    """A stream's notification (None: not an events frame). Raises :class:`ResultTypeError` for a malformed one."""
    if method not in STREAM_METHODS:
        return None
    if method == "notifications/events/event":
        return StreamFrame(PollResult((occurrence(params),), cursor_of(params.get("cursor"), where=method)))
    if method == "notifications/events/active":
        return StreamFrame(PollResult((), cursor_of(params.get("cursor"), where=method),
                                      truncated=params.get("truncated") is True))
    if method == "notifications/events/heartbeat":
        if "cursor" not in params:  # a heartbeat may carry nothing but liveness
            return StreamFrame()
        return StreamFrame(PollResult((), cursor_of(params.get("cursor"), where=method)))
    return StreamFrame(error=_error_text(params), ended=method == "notifications/events/terminated")
