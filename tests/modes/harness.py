"""Build and run a daemon driver in a test, with its events captured."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from agentd.agent.budgets import Limits
from agentd.agent.result import RunResult
from agentd.config.model import from_flat
from agentd.modes.continue_route import conversation_sessions
from agentd.modes.drivers import DaemonContext, run_daemon
from agentd.modes.governor import LifetimeBudget
from agentd.modes.runs import DaemonRuns, RunJob
from agentd.telemetry.events import EventLog

#: 2026-01-01T00:00:30Z: cron tests start half a minute past a whole minute.
EPOCH = 1767225630.0


@attrs.define(eq=False)
class Running:
    ctx: DaemonContext
    events: list[dict[str, Any]]
    result: RunResult | None = None
    done: trio.Event = attrs.field(factory=trio.Event)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    async def drain(self, timeout: float = 600) -> RunResult:
        self.ctx.drain.set()
        return await self.finished(timeout)

    async def finished(self, timeout: float = 600) -> RunResult:
        with trio.fail_after(timeout):
            await self.done.wait()
        assert self.result is not None
        return self.result


def context(job: RunJob, pool: Any = None, **config: Any) -> DaemonContext:
    config.setdefault("instruction", "do the thing")
    config.setdefault("intelligence", ("test",))
    cfg = from_flat(config)
    events: list[dict[str, Any]] = []
    log = EventLog(sink=events.append, level="debug", run_id="r")
    runs = DaemonRuns(job, base_run_id="r", limits=Limits(cfg.budgets.max_steps, cfg.budgets.max_tokens, cfg.budgets.deadline), log=log,
                      budget=LifetimeBudget(cfg.budgets.tokens_lifetime))
    ctx = DaemonContext(cfg, runs, log, trio.Event(), pool=pool, server_names=["mem"],
                        open_session=conversation_sessions(runs), wall_clock=lambda: EPOCH + trio.current_time())
    return ctx


def events_of(ctx: DaemonContext) -> list[dict[str, Any]]:
    """The list the context's log appends to (its sink is that list's bound ``append``)."""
    events = ctx.log.sink.__self__  # type: ignore[attr-defined]
    assert isinstance(events, list)
    return events


@asynccontextmanager
async def running(ctx: DaemonContext) -> AsyncIterator[Running]:
    handle = Running(ctx, events_of(ctx))

    async def body(task_status: trio.TaskStatus[None]) -> None:
        try:
            handle.result = await run_daemon(ctx, task_status=task_status)
        finally:
            handle.done.set()

    with trio.fail_after(100_000):
        async with trio.open_nursery() as nursery:
            await nursery.start(body)
            yield handle
            if not handle.done.is_set():
                await handle.drain()
