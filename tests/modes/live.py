"""Helpers for end-to-end reactive tests: the real daemon_mode against real peers and the scripted gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from agentd.agent.result import RunResult
from agentd.config.model import Config, McpServerConfig, from_flat
from agentd.errors import flatten
from agentd.modes.entry import daemon_mode
from agentd.supervisor.wiring import open_root_supervisor
from agentd.telemetry.events import EventLog

Pred = Callable[[dict[str, Any]], bool]


@attrs.define(eq=False)
class Events:
    """Captured event lines, with waits for the first line matching a predicate."""

    lines: list[dict[str, Any]] = attrs.field(factory=list)
    _waiters: list[tuple[Pred, trio.Event]] = attrs.field(factory=list)

    def sink(self, line: dict[str, Any]) -> None:
        self.lines.append(line)
        for pred, event in self._waiters:
            if pred(line):
                event.set()

    def named(self, name: str, **fields: Any) -> list[dict[str, Any]]:
        return [e for e in self.lines if e["event"] == name and all(e.get(k) == v for k, v in fields.items())]

    async def wait_for(self, name: str, count: int = 1, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
        """Wait until ``count`` lines named ``name`` (with ``fields``) were emitted; the last one."""
        with trio.fail_after(timeout):
            while len(self.named(name, **fields)) < count:
                event = trio.Event()
                entry = (lambda e: e["event"] == name and all(e.get(k) == v for k, v in fields.items()), event)
                self._waiters.append(entry)
                try:
                    if len(self.named(name, **fields)) >= count:
                        break
                    await event.wait()
                finally:
                    self._waiters.remove(entry)
        return self.named(name, **fields)[count - 1]


@attrs.define(eq=False)
class LiveDaemon:
    events: Events
    drain: trio.Event
    result: RunResult | None = None
    error: Exception | None = None
    done: trio.Event = attrs.field(factory=trio.Event)

    def wake_ends(self) -> list[dict[str, Any]]:
        return [e for e in self.events.named("run.end") if e.get("trigger") in ("wake", "continue")]

    async def stop(self, timeout: float = 30.0) -> RunResult:
        self.drain.set()
        with trio.fail_after(timeout):
            await self.done.wait()
        assert self.result is not None
        return self.result


def config(gateway_url: str, servers: dict[str, str], **fields: Any) -> Config:
    fields.setdefault("instruction", "Keep the counter report up to date")
    fields.setdefault("mode", "reactive")
    fields.setdefault("debounce", 0.05)
    return from_flat(dict(intelligence=(gateway_url,), mcp=tuple(McpServerConfig(name, url, connect_timeout=5.0, call_timeout=10.0)
                            for name, url in servers.items()), **fields))


@asynccontextmanager
async def live_daemon(cfg: Config, *, armed: int = 1) -> AsyncIterator[LiveDaemon]:
    """Run ``daemon_mode`` until the block ends (then drain); yields once ``armed`` URIs are armed."""
    events = Events()
    log = EventLog(sink=events.sink, level="debug", run_id="live")
    daemon = LiveDaemon(events, trio.Event())
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            async def body() -> None:
                try:
                    async with open_root_supervisor(cfg, log=log, env={}, run_id=log.run_id) as supervisor:
                        daemon.result = await daemon_mode(cfg, log, nursery, supervisor=supervisor,
                                                          drain=daemon.drain)
                except Exception as exc:
                    daemon.error = flatten(exc)  # what the daemon ended with, out of the supervisor's nursery group
                finally:
                    daemon.done.set()
                    for _, event in events._waiters:
                        event.set()

            nursery.start_soon(body)
            with trio.fail_after(40):
                while len(events.named("trigger.armed")) < armed and not daemon.done.is_set():
                    event = trio.Event()
                    events._waiters.append((lambda e: e["event"] in ("trigger.armed", "run.end"), event))
                    await event.wait()
            yield daemon
            if not daemon.done.is_set():
                await daemon.stop()
