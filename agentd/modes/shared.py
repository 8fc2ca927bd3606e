"""What a daemon mode hands to the cluster when it runs as a member (``--cluster``): subscriptions and self-scheduled
runs that are the cluster's, not this process's.

Why a seam: the reactive machinery (watcher, router, runs) stays the same on one host and in a cluster; only
who subscribes, and who fires a scheduled run, changes. Without ``--cluster`` nothing here is used and the daemon
subscribes and schedules by itself exactly as before. With it, agentd.modes.clustered implements
:class:`Shared`: a subscription is watched only by the member that holds its lease, and a self-scheduled run is a
work item any member may claim. Nothing here imports the database driver.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import trio

from agentd.modes.watch import Watcher

#: ``notify(uri, server)``: an update of ``uri`` to route to a wake (agentd.modes.router.Router.notify).
Notify = Callable[[str, "str | None"], None]


class EventOwner(Protocol):
    """The MCP event subscriptions (agentd.modes.events.EventRoute) a member polls only while it holds them."""

    def owns(self, key: str) -> bool: ...

    def start(self, key: str, cursor: str | None) -> None:
        """Deliver the subscription ``key`` from ``cursor`` (None: from now) on this member."""
        ...

    def stop(self, key: str) -> None:
        """Stop delivering ``key`` here (another member owns it now); what was pending is the next owner's."""
        ...


class Shared(Protocol):
    """A member's part in the cluster's subscriptions and self-scheduled runs."""

    async def serve(self, watcher: Watcher, notify: Notify, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own subscriptions (watch what this member holds, hand back what it loses) until cancelled."""
        ...

    async def declare(self, subscriptions: Sequence[tuple[str | None, str]]) -> None:
        """The configured ``(server, uri)`` subscriptions of this member (replacing the earlier set)."""
        ...

    async def record(self, uri: str, contents: Sequence[Mapping[str, Any]] | None) -> bool:
        """A wake of ``uri`` read ``contents``: record it under this member's lease. False: the lease is not ours
        (another member owns the subscription now, fenced) and the wake must not run here."""
        ...

    async def subscribe(self, uri: str) -> None:
        """The agent subscribed itself to ``uri`` (the ``subscribe`` self-tool)."""
        ...

    async def unsubscribe(self, uri: str) -> bool:
        """The agent unsubscribed itself; False when it had not subscribed to ``uri``."""
        ...

    async def schedule(self, after: float, instruction: str) -> bool:
        """A run the agent scheduled for itself, fired once in the cluster ``after`` seconds from now."""
        ...

    def attach_events(self, owner: EventOwner) -> None:
        """Event subscriptions (rows keyed ``event:SERVER/NAME``) are delivered by ``owner`` while held."""
        ...

    async def record_event(self, key: str, cursor: str | None, *, wake: bool) -> bool:
        """An event subscription's cursor, recorded under this member's lease (``wake``: a wake carrying the
        occurrences before it is about to run). False: the lease is not ours (fenced) and the wake must not run."""
        ...
