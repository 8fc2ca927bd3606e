"""Structured events: one JSON object per line, a fixed schema and a closed vocabulary.

Every component logs through an :class:`EventLog`. A line always holds ``ts`` (RFC 3339 UTC, ms),
``level``, ``event``, ``run_id``, ``agent_path``, ``comp`` and ``pid`` (and ``trace_id``/``span_id`` of the
current span while tracing is on); the event's own fields follow.
Event names must be in :data:`VOCABULARY` (docs/events.md lists them with their fields), so a typo is a
test failure instead of a silently new event.

Secrets cannot reach a line: every resolved secret value is registered with the log's
:class:`Redactor`, and each string field is scrubbed before it is written. Bodies and arguments are
logged as lengths unless the log was opened with ``log_content=True``.

A peer can make agentd log without bound (huge arguments echoed in a rejection reason, thousands of update
notifications a second, a bad-bearer flood on the served endpoint), so two limits hold for every line:

* **Size**: a string field longer than :data:`MAX_FIELD_CHARS` is cut and ends with a marker that gives the
  original length; a list or mapping keeps its first :data:`MAX_FIELD_ITEMS` items (a marker says how many
  were left out). This holds with ``--log-content`` too.
* **Rate**: at most :data:`RATE_LIMIT` lines per event name (and agent path, and ``server`` or ``handle``
  field when the line has one) per :data:`RATE_WINDOW` seconds.
  Lines over it are dropped and counted; once the window has passed, the next line written carries the
  count in a ``log.suppressed`` line (``error`` level when an error line was among them, so errors are
  summarised, never silently lost). :meth:`EventLog.flush` writes the pending summaries at once.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Final, TextIO

import attrs

from agentd import telemetry
from agentd.formats import jsontext as json_text

LEVELS: Final = {"debug": 10, "info": 20, "warn": 30, "error": 40}

#: Characters kept of one string field (longer ones end with a ``…[truncated: N chars]`` marker).
MAX_FIELD_CHARS: Final = 8192
#: Items kept of one list or mapping field (a marker item says how many more there were).
MAX_FIELD_ITEMS: Final = 256
#: Nesting depth kept of a field (deeper values are replaced by a marker).
MAX_FIELD_DEPTH: Final = 8
#: Lines per event name (and agent path) per :data:`RATE_WINDOW` seconds; more are counted, not written.
RATE_LIMIT: Final = 50
RATE_WINDOW: Final = 1.0
#: Fields that split an event's rate budget: one server's or one subagent's flood does not silence another's.
RATE_KEY_FIELDS: Final = ("server", "handle")

#: Every event agentd emits. Grouped by component; docs/events.md documents each one.
VOCABULARY: Final[frozenset[str]] = frozenset(
    {
        # process and configuration
        "proc.start", "proc.ready", "proc.exit", "proc.signal", "config.loaded", "config.warning", "config.invalid",
        # one run of the agent
        "run.start", "run.end", "run.failed", "run.cancelled", "run.resumed", "run.replayed",
        # the run journal (--state-dir)
        "journal.opened", "journal.write_failed",
        "cluster.joined", "cluster.claimed", "cluster.finished", "cluster.fenced", "cluster.lease_lost",
        "cluster.unavailable", "cluster.available", "cluster.claim_failed", "cluster.heartbeat_failed",
        "cluster.work_failed", "cluster.cancel",
        "cluster.subscription_owned", "cluster.subscription_lost", "cluster.subscription_released",
        "cluster.subscription_fenced",
        # MCP client side
        "mcp.connect", "mcp.connected", "mcp.connect_failed", "mcp.disconnected", "mcp.reconnect",
        "mcp.stale", "mcp.ping_missed", "mcp.catalogue", "mcp.tool_unusable",
        "mcp.tool_pin_mismatch", "mcp.list_changed",
        "mcp.retry", "mcp.server_down",
        "mcp.subscribe", "mcp.subscribe_degraded", "mcp.updated", "mcp.cancelled", "mcp.server_request",
        "mcp.protocol_error", "mcp.stream", "mcp.closed", "mcp.era",
        "mcp.task", "mcp.task_pushed", "mcp.task_input", "mcp.task_resumed", "mcp.task_cancelled", "mcp.task_cancel_failed",
        "mcp.task_poll_failed",
        # A2A client side (peers a run delegates to) and the served A2A endpoint
        "a2a.card", "a2a.card_failed", "a2a.skill_description", "a2a.delegate", "a2a.task_end", "a2a.cancel",
        "a2a.cancel_failed", "a2a.served",
        "a2a.resubscribe", "a2a.extended_card_failed",
        # intelligence gateway
        "intel.call", "intel.checked", "intel.delta", "intel.result", "intel.retry", "intel.failover", "intel.breaker", "intel.error",
        # the loop and its tools
        "loop.start", "loop.step", "loop.final", "loop.budget", "loop.cut_reply", "tool.call", "tool.result",
        "tool.rejected", "approval.pending", "approval.decided", "elicitation.pending", "elicitation.decided",
        "sampling.request",
        "model.tool.requested", "model.tool.started", "model.tool.completed",
        # supervisor and subagents
        "subagent.spawn", "subagent.resumed", "subagent.refused", "subagent.ready", "subagent.result", "subagent.failed",
        "subagent.exit", "subagent.stuck", "subagent.cancel", "subagent.sigterm", "subagent.sigkill",
        "subagent.stderr", "subagent.drain", "graph.start", "graph.node", "graph.end",
        # the self-MCP server
        "serve.start", "serve.stop", "serve.request", "serve.refused", "serve.evicted", "serve.session",
        "serve.cert_reload", "serve.updated", "serve.event", "serve.events_stream", "serve.stream_ended",
        "serve.connection_error", "serve.jwks", "serve.restored",
        # reactive and daemon modes
        "trigger.armed", "trigger.fired", "resource.updated", "reactive.wake", "reactive.wake_failed",
        "reactive.throttled",
        "reactive.degraded", "reactive.unowned",
        "events.received", "events.polled", "events.stream_active", "events.poll_failed", "events.poll_recovered",
        "events.data_cut", "events.subscribed", "events.unsubscribed", "events.unsubscribe_failed",
        "webhook.refused", "webhook.duplicate", "webhook.malformed",
        "trigger.dropped",
        "schedule.fire", "governor.backoff", "governor.breaker", "budget.exhausted", "budget.restored",
        "drain.start", "drain.end",
        # operator controls (agentd ctl, SIGHUP)
        "ctl.listening", "ctl.refused", "ctl.failed", "ctl.pause", "ctl.resume", "ctl.lame_duck", "ctl.cancel",
        "ctl.reload", "ctl.decide",
        # host connections, transcript
        "connection.auth", "connection.authorization_required", "transcript.write",
        # security: the egress guard and the Rule of Two
        "egress.refused", "security.trifecta_allowed",
        # the log itself
        "log.suppressed",
    }
)


class Redactor:
    """Scrubs registered secret values out of strings. Shared by a log and everything it binds."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()

    def add(self, value: str) -> None:
        # Very short values would redact innocent text everywhere; they are not plausible credentials.
        if len(value) >= 4:
            self._secrets.add(value)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "***")
        return text

    def scrub_value(self, value: Any) -> Any:
        """``value`` with every string in it (mapping keys and values, list items) scrubbed."""
        if not self._secrets:
            return value
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, Mapping):
            return {self.scrub_value(k): self.scrub_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub_value(v) for v in value]
        return value


#: A mapping key is cut to this many characters.
KEY_CHARS: Final = 256


def truncate(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with a marker giving the original length when it was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"…[truncated: {len(text)} chars]"


@attrs.frozen
class Suppressed:
    """A summary the rate limiter owes: ``count`` lines of ``event`` were dropped, ``errors`` of them errors."""

    event: str
    agent_path: str
    scope: str
    count: int
    errors: int
    window_s: float


class _Window:
    __slots__ = ("dropped", "errors", "start", "written")

    def __init__(self, start: float) -> None:
        self.start = start
        self.written = 0
        self.dropped = 0
        self.errors = 0


class RateLimiter:
    """Per (event name, agent path): at most ``limit`` lines per ``window`` seconds. Pure bookkeeping over the
    ``now`` the caller passes; shared by a log and everything it binds, like the :class:`Redactor`. (The
    limiter, its windows and the level dial are plain classes: every process builds them at start-up.)"""

    __slots__ = ("_started", "_windows", "limit", "window")

    def __init__(self, limit: int = RATE_LIMIT, window: float = RATE_WINDOW) -> None:
        self.limit = limit
        self.window = window
        self._windows: dict[tuple[str, str, str], _Window] = {}
        #: Every window in the order it started: ``due`` looks only at those that have ended (each once), so a
        #: line costs the same with one subagent or 500, each with its own windows.
        self._started: collections.deque[tuple[tuple[str, str, str], _Window]] = collections.deque()

    def admit(self, event: str, agent_path: str, level: str, now: float, scope: str = "") -> bool:
        """Whether this line may be written now; a dropped one is counted for the next summary. ``scope``
        splits the budget further (a server name, a subagent handle)."""
        if self.limit <= 0:
            return True
        key = (event, agent_path, scope)
        window = self._windows.get(key)
        if window is None or now - window.start >= self.window:  # (a summary owed was handed out by due)
            window = self._windows[key] = _Window(now)
            self._started.append((key, window))
        if window.written < self.limit:
            window.written += 1
            return True
        window.dropped += 1
        window.errors += level == "error"
        return False

    def due(self, now: float, *, everything: bool = False) -> list[Suppressed]:
        """Summaries of windows that have passed (all of them with ``everything``); each is owed once."""
        owed: list[Suppressed] = []
        if everything:
            ended = sorted(self._windows.items(), key=lambda item: item[1].start)
            self._started.clear()
        else:
            ended = []
            while self._started and now - self._started[0][1].start >= self.window:
                ended.append(self._started.popleft())
        for key, window in ended:
            if self._windows.get(key) is not window:
                continue  # replaced since (by admit): its successor has its own place
            if window.dropped and (everything or now - window.start >= self.window):
                owed.append(Suppressed(key[0], key[1], key[2], window.dropped, window.errors, self.window))
                window = self._windows[key] = _Window(now)
                self._started.append((key, window))
            elif now - window.start >= self.window:
                del self._windows[key]  # idle: keep the table as small as the set of busy events
            else:
                self._started.append((key, window))  # flushed early (everything), not ended: still counts
        return owed


#: The last whole second formatted, with its text (one tuple: a thread never reads one second's text for another):
#: lines come many a second, and ``strftime`` is most of a stamp.
_STAMP: list[tuple[int, str]] = [(-1, "")]


def _rfc3339_ms(now: float) -> str:
    seconds = int(now)
    stamp = _STAMP[0]
    if stamp[0] != seconds:
        stamp = _STAMP[0] = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{stamp[1]}.{int((now - seconds) * 1000):03d}Z"


#: This process's id for every line (looked up once, and again in a forked child).
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


Sink = Callable[[dict[str, Any]], None]


def stream_sink(stream: TextIO) -> Sink:
    """A sink that writes each event as one JSON line to ``stream`` and flushes it.

    A line the stream cannot take (its reader is gone: a child whose parent was killed, a closed
    terminal) is dropped: logging never raises into the code that logs, which is often cleanup.
    """

    def write(line: dict[str, Any]) -> None:
        text = json_text.escape_controls(json_text.scrub(json.dumps(line, ensure_ascii=False, default=str))) + "\n"
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # EPIPE, or the stream is closed
            pass

    return write


class LevelDial:
    """A level shared by a log and every copy bound from it, so a reload can change it for all of them."""

    __slots__ = ("level",)

    def __init__(self, level: str) -> None:
        self.level = level


class EventLog:
    """A bound structured logger. :meth:`bind` makes a child sharing the sink and redactor (and the
    :class:`LevelDial`, when the log has one: then the dial's level wins over ``level``). (A plain class, like
    the other mutable holders a once run builds at start-up: building an attrs class costs about a
    millisecond.)"""

    __slots__ = ("agent_path", "clock", "comp", "dial", "level", "limiter", "log_content", "redactor", "run_id",
                 "sink")

    def __init__(self, sink: Sink | None = None, level: str = "info", run_id: str = "", agent_path: str = "0",
                 comp: str = "agent", log_content: bool = False, redactor: Redactor | None = None,
                 limiter: RateLimiter | None = None, clock: Callable[[], float] = time.monotonic,
                 dial: LevelDial | None = None) -> None:
        self.sink: Sink = stream_sink(sys.stderr) if sink is None else sink
        self.level = level
        self.run_id = run_id
        self.agent_path = agent_path
        self.comp = comp
        self.log_content = log_content
        self.redactor: Redactor = Redactor() if redactor is None else redactor
        self.limiter: RateLimiter = RateLimiter() if limiter is None else limiter
        self.clock = clock
        self.dial = dial

    def __repr__(self) -> str:
        return (f"EventLog(level={self.level!r}, run_id={self.run_id!r}, agent_path={self.agent_path!r}, "
                f"comp={self.comp!r})")

    def bind(self, **changes: Any) -> EventLog:
        """A copy with ``changes`` (what ``attrs.evolve`` did: every field passed to ``__init__`` again)."""
        return type(self)(**{**{name: getattr(self, name) for name in EventLog.__slots__}, **changes})

    def enabled(self, level: str) -> bool:
        return LEVELS[level] >= LEVELS[self.level if self.dial is None else self.dial.level]

    def emit(self, event: str, level: str = "info", /, **fields: Any) -> None:
        if event not in VOCABULARY:
            raise ValueError(f"event {event!r} is not in the vocabulary (agentd/telemetry/events.py)")
        if not self.enabled(level):
            return
        now = self.clock()
        for owed in self.limiter.due(now):
            self._summary(owed)
        scope = ("/".join([str(value) for name in RATE_KEY_FIELDS if (value := fields.get(name)) is not None])
                 if not fields.keys().isdisjoint(RATE_KEY_FIELDS) else "")
        if not self.limiter.admit(event, self.agent_path, level, now, scope[:256]):
            return
        line: dict[str, Any] = {
            "ts": _rfc3339_ms(time.time()),
            "level": level,
            "event": event,
            "run_id": self.run_id,
            "agent_path": self.agent_path,
            "comp": self.comp,
            "pid": _PID[0],
        }
        ids = telemetry.log_ids()
        if ids is not None:
            line.update(ids)
        # Most fields are numbers, or short text with no secret registered: kept as they are, without a call; so
        # are short lists of those (tool names, servers) and flat maps of them (token usage).
        clean, plain = self._clean, not self.redactor._secrets
        for key, value in fields.items():
            kind = type(value)
            if (kind is int or kind is float or kind is bool or value is None
                    or (plain and kind is str and len(value) <= MAX_FIELD_CHARS)):
                line[key] = value
            elif plain and (kind is list or kind is tuple) and _flat(value):
                line[key] = list(value)
            elif plain and kind is dict and _flat(value.values()) and _short_keys(value):
                line[key] = dict(value)
            else:
                line[key] = clean(value, 0)
        self.sink(line)

    def flush(self) -> None:
        """Write every pending ``log.suppressed`` summary now (before the process exits)."""
        for owed in self.limiter.due(self.clock(), everything=True):
            self._summary(owed)

    def _summary(self, owed: Suppressed) -> None:
        level = "error" if owed.errors else "warn"
        self.sink({
            "ts": _rfc3339_ms(time.time()), "level": level, "event": "log.suppressed", "run_id": self.run_id,
            "agent_path": owed.agent_path, "comp": self.comp, "pid": _PID[0],
            "suppressed_event": owed.event, "suppressed": owed.count, "errors": owed.errors,
            "window_s": owed.window_s, **({"scope": self.redactor.scrub(owed.scope)} if owed.scope else {}),
        })  # fmt: skip

    def debug(self, event: str, /, **fields: Any) -> None:
        self.emit(event, "debug", **fields)

    def info(self, event: str, /, **fields: Any) -> None:
        self.emit(event, "info", **fields)

    def warn(self, event: str, /, **fields: Any) -> None:
        self.emit(event, "warn", **fields)

    def error(self, event: str, /, **fields: Any) -> None:
        self.emit(event, "error", **fields)

    def content(self, value: str | bytes) -> str | int:
        """What to log for a body or an argument: the text with ``--log-content``, else its length."""
        if self.log_content:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
        return len(value)

    def _clean(self, value: Any, depth: int) -> Any:
        kind = type(value)
        if kind is int or kind is float or kind is bool or value is None:  # most fields: no ABC checks
            return value
        if isinstance(value, str):
            # Scrubbed before the cut, so a secret straddling the cut is not half-logged.
            return truncate(self.redactor.scrub(value))
        if isinstance(value, bytes | bytearray):
            return len(value)
        if isinstance(value, Mapping | list | tuple | set | frozenset) and depth >= MAX_FIELD_DEPTH:
            return f"…[nested deeper than {MAX_FIELD_DEPTH}]"
        if isinstance(value, Mapping):
            cleaned = {truncate(str(k), KEY_CHARS): self._clean(v, depth + 1)
                       for k, v in _first(value.items(), MAX_FIELD_ITEMS)}  # fmt: skip
            if len(value) > MAX_FIELD_ITEMS:
                cleaned["…"] = f"[{len(value) - MAX_FIELD_ITEMS} more]"
            return cleaned
        if isinstance(value, list | tuple | set | frozenset):
            items = [self._clean(v, depth + 1) for v in _first(value, MAX_FIELD_ITEMS)]
            if len(value) > MAX_FIELD_ITEMS:
                items.append(f"…[{len(value) - MAX_FIELD_ITEMS} more]")
            return items
        if isinstance(value, int | float | bool) or value is None:
            return value
        return truncate(self.redactor.scrub(str(value)))


def _flat(items: Collection[Any]) -> bool:
    """At most ``MAX_FIELD_ITEMS`` numbers and short strings: what :meth:`EventLog._clean` keeps as they are when no
    secret is registered."""
    if len(items) > MAX_FIELD_ITEMS:
        return False
    for item in items:
        kind = type(item)
        if not (kind is int or kind is float or kind is bool or item is None
                or (kind is str and len(item) <= MAX_FIELD_CHARS)):
            return False
    return True


def _short_keys(mapping: Mapping[Any, Any]) -> bool:
    return all(type(key) is str and len(key) <= KEY_CHARS for key in mapping)


def _first(items: Iterable[Any], count: int) -> Iterator[Any]:
    return itertools.islice(items, count)


def null_log() -> EventLog:
    """A log that drops everything (library use and tests that do not look at events)."""
    return EventLog(sink=lambda line: None)
