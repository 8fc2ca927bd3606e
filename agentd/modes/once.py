"""A once run's ``subscribe`` and ``await_resource``: waits inside the run, on the run's own pool.

Why it exists: the daemon modes' ``subscribe`` queues a subscription the daemon applies after the run, and
a once run has no after (its process ends with it). So a once run's ``subscribe`` is the in-run kind
(agentd.modes.selftools.once_tools): the model that wants to see a resource change waits for it inside the
run and converges within it. :func:`in_run_waits` is what ``run_config(beside=...)`` holds around the loop:
a :class:`~agentd.modes.watch.Watcher` on the run's pool that routes nothing (a once run has no wakes) and
only wakes the waiting call; each subscription lasts for one call and is dropped (shielded, bounded) when
the call ends, and the pump ends with the run.

A server that cannot push updates for the URI is polled every ``--poll-interval`` seconds when one is set;
without one the call is a tool fault the model sees (the loop's observation for an agentd error), and the
run goes on.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio

from agentd.agent.control import ControlToolRegistry
from agentd.modes.selftools import once_tools
from agentd.modes.watch import Watcher
from agentd.run import Opened
from agentd.telemetry.events import EventLog


def _route_nothing(uri: str, server: str | None) -> None:
    """A once run has no wakes: an update only wakes the call waiting for it."""


@contextlib.asynccontextmanager
async def in_run_waits(opened: Opened, controls: ControlToolRegistry, log: EventLog, poll_interval: float | None
                       ) -> AsyncIterator[None]:
    """The watcher on ``opened``'s pool and the once tools on ``controls``, for the loop's life (no MCP
    server: nothing to subscribe to, nothing offered; a tool of that name the caller registered stays)."""
    if not opened.pool.connections:
        yield
        return
    watcher = Watcher(opened.pool, _route_nothing, poll_interval=poll_interval, log=log)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        for tool in once_tools(watcher):
            if tool.name not in controls:
                controls.register(tool)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()
