"""The Events extension as agentd serves it: event types, ``events/poll`` parameters, cursors, and the log.

Why it exists: a parent that spawned served subagents wants to learn that they finished without holding a
connection open (``subagent.spawn`` with ``async``, then nothing). The Events extension
(``io.modelcontextprotocol/events``, SEP-3415, defined for protocol 2026-07-28) is exactly that: a server lists
event types (``events/list``) and a client asks "what happened since this cursor?" (``events/poll``), or holds
one request open per subscription and is told as it happens (``events/stream``, push delivery). agentd serves it
on the modern wire only (extensions are negotiated per request there); the 2025-11-25 served capability set stays
exactly ``tools`` and ``resources.subscribe``.

What is decided here, as data, with no I/O: the catalogue (:data:`EVENT_TYPES`), the validation of a poll's
parameters (:func:`parse_poll`; a stream's are the same), the frames of a push stream (:func:`stream_frame`),
the cursor (:class:`Cursor`: an epoch naming one log, and a position in it), and
:class:`EventLog`, the bounded log itself (count and age) and what one poll answers from it. Persistence (the
journal with ``--state-dir``) and the surface's glue live in agentd.selfmcp.served_events.

The log is one sequence for every principal: each event keeps its owner, and a poll answers only the events its
``visible`` predicate accepts (a principal sees its own handles' events). A cursor is a position in that sequence,
so it stays valid across sessions, wires and (with a journal) restarts: a poll with an old cursor returns every
later event once. A cursor from another log (its epoch differs: the daemon restarted without a journal) starts
from the oldest kept event with ``truncated: true``; so does a cursor whose next events were dropped by the
bounds. A string that is no cursor this server returned is ``-32602``.
"""

from __future__ import annotations

import datetime
import json
import re
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from agentd.mcp import jsonrpc, meta

#: The extension's identifier (one declaration, :data:`agentd.mcp.meta.EVENTS_EXTENSION`, shared with the client
#: side), in ``server/discover``'s ``capabilities.extensions`` and in the per-request client capabilities an
#: ``events/*`` request must carry.
EXTENSION: Final = meta.EVENTS_EXTENSION
#: The methods agentd answers: poll and push delivery (``events/subscribe``, webhook delivery, is not offered and
#: no event type lists it, which the extension allows: no delivery mode is mandatory; it also needs an
#: authenticated principal, which a listener without OAuth does not have).
#: Push delivery: one long-lived request per subscription, answered as an SSE stream of notifications.
STREAM: Final = "events/stream"
METHODS: Final = frozenset({"events/list", "events/poll", STREAM})
#: The delivery modes every served event type lists.
DELIVERY: Final = ("poll", "push")

SUBAGENT_FINISHED: Final = "subagent.finished"
BUDGET_EXHAUSTED: Final = "budget.exhausted"
APPROVAL_PENDING: Final = "approval.pending"
APPROVAL_DECIDED: Final = "approval.decided"

#: Subscription arguments: optional, a handle to watch one run only.
_ARGUMENTS_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"handle": {"type": "string", "description": "only this served handle's events"}},
    "additionalProperties": False,
}

EVENT_TYPES: Final[tuple[dict[str, Any], ...]] = (
    {
        "name": SUBAGENT_FINISHED,
        "description": "a served subagent (subagent.spawn, on either protocol version) ended: its handle, final "
                       "status and result, as subagent.status answers it",
        "inputSchema": _ARGUMENTS_SCHEMA,
        "payloadSchema": {
            "type": "object",
            "properties": {
                "handle": {"type": "string"},
                "status": {"type": "string"},
                "done": {"type": "boolean"},
                "partial": {"type": "boolean"},
                "result": {},
                "result_omitted": {"type": "boolean"},
                "turns": {"type": "integer"},
            },
            "required": ["handle", "status"],
        },
        "delivery": list(DELIVERY),
    },
    {
        "name": BUDGET_EXHAUSTED,
        "description": "a served subagent ended because its token budget (--token-ceiling) ran out",
        "inputSchema": _ARGUMENTS_SCHEMA,
        "payloadSchema": {
            "type": "object",
            "properties": {"handle": {"type": "string"}, "status": {"type": "string"}},
            "required": ["handle", "status"],
        },
        "delivery": list(DELIVERY),
    },
    {
        "name": APPROVAL_PENDING,
        "description": "something waits for a person: a tool call marked approve (its tool as server__tool and a "
                       "summary of its arguments, secrets shown as ***) or a server's question (kind elicitation: "
                       "its message and schema); decide it with agentd ctl approve, deny or answer and its id",
        "inputSchema": _ARGUMENTS_SCHEMA,
        "payloadSchema": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "kind": {"type": "string", "enum": ["approval", "elicitation"]},
                "run_id": {"type": "string"},
                "handle": {"type": "string"},
                "server": {"type": "string"},
                "tool": {"type": "string"},
                "summary": {"type": "object"},
                "message": {"type": "string"},
                "schema": {"type": "object"},
            },
            "required": ["id", "kind", "run_id"],
        },
        "delivery": list(DELIVERY),
    },
    {
        "name": APPROVAL_DECIDED,
        "description": "what waited for a person waits no more: the action decided (approve, deny, accept, "
                       "decline, cancel), or withdrawn when its run ended or agentd stopped first",
        "inputSchema": _ARGUMENTS_SCHEMA,
        "payloadSchema": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "kind": {"type": "string"},
                "run_id": {"type": "string"},
                "handle": {"type": "string"},
                "action": {"type": "string"},
                "reason": {"type": "string"},
            },
            "required": ["id", "kind", "run_id", "action"],
        },
        "delivery": list(DELIVERY),
    },
)
NAMES: Final = frozenset(t["name"] for t in EVENT_TYPES)

#: Events a poll returns at most, and by default.
MAX_EVENTS: Final = 100
DEFAULT_MAX_EVENTS: Final = 50
#: A ``subagent.finished`` result bigger than this (JSON characters) is left out (``result_omitted``): the event
#: says the run ended, ``subagent.status`` gives the result; the log stays bounded in bytes, not only in count.
MAX_RESULT_CHARS: Final = 16 * 1024

_CURSOR_RE: Final = re.compile(r"^v1\.([0-9a-f]{16})\.([0-9]{1,18})$")


#: The extension's error for an event type the server does not offer (``data: {kind: "event"}``).
NOT_FOUND: Final = -32011
#: The extension's ResourceExhausted (``data: {limit, max}``): here, a principal's open push streams (numbered
#: in the same allocation as NotFound above).
RESOURCE_EXHAUSTED: Final = -32013


class PollError(Exception):
    """A poll the server refuses: a JSON-RPC error (``-32602`` with the parameter in ``data.field``; an unknown
    event type is the extension's ``-32011``)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.code = jsonrpc.INVALID_PARAMS
        self.data: dict[str, Any] = {"field": field}


class StreamLimit(PollError):
    """An ``events/stream`` past the open streams a principal (or the daemon) may hold."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"ResourceExhausted: at most {limit} open event streams", "name")
        self.code = RESOURCE_EXHAUSTED
        self.data = {"limit": "streams", "max": limit}


class UnknownEvent(PollError):
    def __init__(self, name: str) -> None:
        super().__init__(f"Unknown event: {name[:100]}", "name")
        self.code = NOT_FOUND
        self.data = {"kind": "event"}


@attrs.frozen
class Cursor:
    epoch: str
    seq: int

    def encode(self) -> str:
        return f"v1.{self.epoch}.{self.seq}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        match = _CURSOR_RE.match(text)
        if match is None:
            raise PollError("cursor is not a cursor this server returned", "cursor")
        return cls(match.group(1), int(match.group(2)))


@attrs.frozen
class PollRequest:
    name: str
    handle: str | None
    cursor: Cursor | None
    max_age_ms: float | None
    max_events: int


def parse_poll(params: Mapping[str, Any]) -> PollRequest:
    """An ``events/poll``'s parameters, checked (:class:`PollError` for anything that is not a valid poll)."""
    name = params.get("name")
    if not isinstance(name, str):
        raise PollError("name must be a string", "name")
    if name not in NAMES:
        raise UnknownEvent(name)
    arguments = params.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise PollError("arguments must be an object", "arguments")
    extra = sorted(set(arguments) - {"handle"})
    if extra:
        raise PollError(f"unknown argument {extra[0][:100]!r} (only handle)", "arguments")
    handle = arguments.get("handle")
    if handle is not None and not isinstance(handle, str):
        raise PollError("arguments.handle must be a string", "arguments")
    raw = params.get("cursor")
    if raw is not None and not isinstance(raw, str):
        raise PollError("cursor must be a string or null", "cursor")
    max_age = params.get("maxAgeMs")
    if max_age is not None and (isinstance(max_age, bool) or not isinstance(max_age, (int, float)) or max_age < 0):
        raise PollError("maxAgeMs must be a non-negative number", "maxAgeMs")
    max_events = params.get("maxEvents", DEFAULT_MAX_EVENTS)
    if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
        raise PollError("maxEvents must be a positive integer", "maxEvents")
    return PollRequest(name, handle, Cursor.decode(raw) if raw is not None else None,
                       float(max_age) if max_age is not None else None, min(max_events, MAX_EVENTS))


def declares_extension(params: Mapping[str, Any]) -> bool:
    """Does a modern request declare the extension in its per-request client capabilities?"""
    envelope = params.get("_meta")
    caps = envelope.get(meta.CLIENT_CAPABILITIES) if isinstance(envelope, Mapping) else None
    extensions = caps.get("extensions") if isinstance(caps, Mapping) else None
    return isinstance(extensions, Mapping) and isinstance(extensions.get(EXTENSION), Mapping)


def finished_data(view: Mapping[str, Any]) -> dict[str, Any]:
    """A ``subagent.finished`` payload from a terminal view (handle, status, done, partial, result, turns): the
    result left out when it is bigger than :data:`MAX_RESULT_CHARS`."""
    data = {key: view[key] for key in ("handle", "status", "done", "partial", "result", "turns") if key in view}
    if len(json.dumps(data.get("result"), ensure_ascii=False, default=str)) > MAX_RESULT_CHARS:
        data.pop("result")
        data["result_omitted"] = True
    return data


def iso(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).isoformat().replace("+00:00", "Z")


@attrs.frozen
class Stored:
    """One event as the log keeps it (and as the journal stores it, :meth:`to_json`)."""

    seq: int
    name: str
    owner: str
    data: Mapping[str, Any]
    at: float  # wall clock

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "owner": self.owner, "data": dict(self.data), "at": self.at}

    @classmethod
    def from_json(cls, seq: int, body: Any) -> Stored | None:
        if not isinstance(body, Mapping):
            return None
        name, owner, data, at = body.get("name"), body.get("owner"), body.get("data"), body.get("at")
        if not (isinstance(name, str) and isinstance(owner, str) and isinstance(data, Mapping)
                and isinstance(at, (int, float)) and not isinstance(at, bool)):
            return None
        return cls(seq, name, owner, dict(data), float(at))


@attrs.define
class EventLog:
    """The bounded event sequence: at most ``max_kept`` events, none older than ``max_age`` seconds.

    ``head`` is the last sequence number given out; ``floor`` the last one dropped by the bounds (a cursor below
    it missed events: ``truncated``), and ``floor_at`` that event's time.
    """

    epoch: str
    max_kept: int
    max_age: float
    head: int = 0
    floor: int = 0
    floor_at: float = 0.0
    events: deque[Stored] = attrs.field(factory=deque)

    def append(self, name: str, owner: str, data: Mapping[str, Any], now: float) -> Stored:
        self.head += 1
        event = Stored(self.head, name, owner, dict(data), now)
        self.events.append(event)
        return event

    def trim(self, now: float) -> list[Stored]:
        """Drop what the bounds no longer allow; returns the dropped events (oldest first)."""
        dropped: list[Stored] = []
        while self.events and (len(self.events) > self.max_kept or self.events[0].at < now - self.max_age):
            gone = self.events.popleft()
            self.floor, self.floor_at = gone.seq, gone.at
            dropped.append(gone)
        return dropped

    def restore(self, head: int, floor: int, floor_at: float, events: list[Stored]) -> None:
        self.head, self.floor, self.floor_at = head, floor, floor_at
        self.events = deque(sorted(events, key=lambda e: e.seq))
        if self.events:
            self.head = max(self.head, self.events[-1].seq)

    def cursor(self, seq: int) -> str:
        return Cursor(self.epoch, seq).encode()

    def occurrence(self, event: Stored) -> dict[str, Any]:
        return {"eventId": f"{self.epoch}.{event.seq}", "name": event.name, "timestamp": iso(event.at),
                "data": dict(event.data), "cursor": self.cursor(event.seq)}

    def start(self, cursor: Cursor | None) -> tuple[int, bool]:
        """Where a push stream opened at ``cursor`` starts reading (a sequence number), and whether that skips
        events (``truncated``): the head for ``null`` ("from now"), the oldest kept event's position for another
        log's cursor or one whose next events the bounds dropped (:class:`PollError` for one past the head)."""
        if cursor is None:
            return self.head, False
        if cursor.epoch != self.epoch:
            return self.floor, True
        if cursor.seq > self.head:
            raise PollError("cursor is not a cursor this server returned", "cursor")
        if cursor.seq < self.floor:
            return self.floor, True
        return cursor.seq, False

    def poll(self, request: PollRequest, visible: Callable[[str], bool], now: float, next_poll_ms: int,
             ) -> dict[str, Any]:
        """One ``events/poll`` answer (the result body; the wire adds ``resultType``)."""
        if request.cursor is None:  # from now: no events, the position to poll from
            return {"events": [], "cursor": self.cursor(self.head), "hasMore": False, "truncated": False,
                    "nextPollMs": next_poll_ms}
        truncated = False
        after = request.cursor.seq
        if request.cursor.epoch != self.epoch:
            truncated, after = True, self.floor  # another log's position: everything kept, and say so
        elif after > self.head:
            raise PollError("cursor is not a cursor this server returned", "cursor")
        elif after < self.floor:
            truncated = True
        oldest = now - request.max_age_ms / 1000 if request.max_age_ms is not None else None
        found: list[Stored] = []
        position = max(after, self.floor) if truncated else after
        more = False
        for event in self.events:
            if event.seq <= after:
                continue
            position = event.seq
            if event.name != request.name or not visible(event.owner):
                continue
            if request.handle is not None and event.data.get("handle") != request.handle:
                continue
            if oldest is not None and event.at < oldest:
                truncated = True  # skipped as too old for this poll
                continue
            if len(found) == request.max_events:
                more, position = True, found[-1].seq
                break
            found.append(event)
        if not more:
            position = max(position, self.head)
        return {"events": [self.occurrence(e) for e in found], "cursor": self.cursor(position), "hasMore": more,
                "truncated": truncated, "nextPollMs": next_poll_ms}


def stream_frame(kind: str, subscription: jsonrpc.RequestId, body: Mapping[str, Any]) -> dict[str, Any]:
    """One ``notifications/events/<kind>`` of a push stream (``active``, ``event``, ``heartbeat``): the stream's
    request id in ``_meta["io.modelcontextprotocol/subscriptionId"]``, as on every frame of the stream."""
    return {"jsonrpc": "2.0", "method": f"notifications/events/{kind}",
            "params": {**body, "_meta": meta.subscription_meta(subscription)}}


def stream_final(subscription: jsonrpc.RequestId) -> dict[str, Any]:
    """The empty ``StreamEventsResult`` a stream the server ends (drain) closes with."""
    return {"jsonrpc": "2.0", "id": subscription,
            "result": {"resultType": "complete", "_meta": meta.subscription_meta(subscription)}}


def catalogue() -> dict[str, Any]:
    """``events/list``: every event type (one page)."""
    return {"events": [dict(t) for t in EVENT_TYPES]}
