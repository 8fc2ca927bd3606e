"""Structured events: one JSON object per line, a fixed schema and a closed vocabulary.

Every component logs through an :class:`EventLog`. A line always holds ``ts`` (RFC 3339 UTC, ms),
``level``, ``event``, ``run_id``, ``agent_path``, ``comp`` and ``pid`` (and ``trace_id``/``span_id`` of the
current span while tracing is on); the event's own fields follow.
Event names must be in :data:`VOCABULARY` (docs/events.md lists them with their fields), so a typo is a
test failure instead of a silently new event.

Secrets cannot reach a line: every resolved secret value is registered with the log's
:class:`Redactor`, and each string field is scrubbed before it is written. Bodies and arguments are
logged as lengths unless the log was opened with ``log_content=True``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TextIO

import attrs

from agentd import telemetry

LEVELS: Final = {"debug": 10, "info": 20, "warn": 30, "error": 40}

#: Every event agentd emits. Grouped by component; docs/events.md documents each one.
VOCABULARY: Final[frozenset[str]] = frozenset(
    {
        # process and configuration
        "proc.start", "proc.exit", "proc.signal", "config.loaded", "config.warning", "config.invalid",
        # one run of the agent
        "run.start", "run.end", "run.failed", "run.cancelled",
        # MCP client side
        "mcp.connect", "mcp.connected", "mcp.connect_failed", "mcp.disconnected", "mcp.reconnect",
        "mcp.stale", "mcp.ping_missed", "mcp.catalogue", "mcp.tool_description", "mcp.list_changed",
        "mcp.subscribe", "mcp.subscribe_degraded", "mcp.updated", "mcp.cancelled", "mcp.server_request",
        "mcp.protocol_error", "mcp.stream", "mcp.closed", "mcp.era",
        # intelligence gateway
        "intel.call", "intel.result", "intel.retry", "intel.failover", "intel.breaker", "intel.error",
        # the loop and its tools
        "loop.start", "loop.step", "loop.final", "loop.budget", "tool.call", "tool.result", "tool.rejected",
        "model.tool.requested", "model.tool.started", "model.tool.completed",
        # supervisor and subagents
        "subagent.spawn", "subagent.refused", "subagent.ready", "subagent.result", "subagent.failed",
        "subagent.exit", "subagent.stuck", "subagent.cancel", "subagent.sigterm", "subagent.sigkill",
        "subagent.stderr", "subagent.drain", "graph.start", "graph.node", "graph.end",
        # the self-MCP server
        "serve.start", "serve.stop", "serve.request", "serve.refused", "serve.session", "serve.cert_reload",
        "serve.updated", "serve.connection_error",
        # reactive and daemon modes
        "trigger.armed", "trigger.fired", "resource.updated", "reactive.wake", "reactive.wake_failed",
        "reactive.degraded", "schedule.fire", "governor.backoff", "governor.breaker", "budget.exhausted",
        "drain.start", "drain.end",
        # host connections, transcript
        "connection.auth", "connection.authorization_required", "transcript.write",
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


def _rfc3339_ms(now: float) -> str:
    seconds = int(now)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((now - seconds) * 1000):03d}Z"


Sink = Callable[[dict[str, Any]], None]


def stream_sink(stream: TextIO) -> Sink:
    """A sink that writes each event as one JSON line to ``stream`` and flushes it."""

    def write(line: dict[str, Any]) -> None:
        stream.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
        stream.flush()

    return write


@attrs.define(eq=False)
class EventLog:
    """A bound structured logger. :meth:`bind` makes a child sharing the sink and redactor."""

    sink: Sink = attrs.field(factory=lambda: stream_sink(sys.stderr))
    level: str = "info"
    run_id: str = ""
    agent_path: str = "0"
    comp: str = "agent"
    log_content: bool = False
    redactor: Redactor = attrs.field(factory=Redactor)

    def bind(self, **changes: Any) -> EventLog:
        return attrs.evolve(self, **changes)

    def enabled(self, level: str) -> bool:
        return LEVELS[level] >= LEVELS[self.level]

    def emit(self, event: str, level: str = "info", /, **fields: Any) -> None:
        if event not in VOCABULARY:
            raise ValueError(f"event {event!r} is not in the vocabulary (agentd/events.py)")
        if not self.enabled(level):
            return
        line: dict[str, Any] = {
            "ts": _rfc3339_ms(time.time()),
            "level": level,
            "event": event,
            "run_id": self.run_id,
            "agent_path": self.agent_path,
            "comp": self.comp,
            "pid": os.getpid(),
        }
        ids = telemetry.log_ids()
        if ids is not None:
            line.update(ids)
        for key, value in fields.items():
            line[key] = self._clean(value)
        self.sink(line)

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

    def _clean(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redactor.scrub(value)
        if isinstance(value, Mapping):
            return {str(k): self._clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._clean(v) for v in value]
        return value


def null_log() -> EventLog:
    """A log that drops everything (library use and tests that do not look at events)."""
    return EventLog(sink=lambda line: None)
