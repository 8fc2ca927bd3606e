"""Served async spawns as cluster work (``--cluster`` with ``--serve-mcp``): any member runs them, any member
answers for their handles.

Why a backend: the served surface talks to its runs only through
:class:`~agentd.selfmcp.backend.SelfMcpBackend`. :class:`ClusterBackend` wraps the supervisor's backend: an
``async`` (detached, not warm) ``subagent.spawn`` becomes a row in the shared work queue
(agentd.cluster.work) under a ``cluster.<id>`` handle, which any member claims within its capacity and runs
with the shared journal (so a member's death moves it, resumed, to another member); every other spawn (sync,
warm) stays on this member's supervisor. The handle's state is read from the shared journal, so
``subagent.status``, ``resources/read`` and ``resources/subscribe`` of ``agent://subagent/cluster.<id>`` work the
same on every member (:meth:`ClusterBackend.lookup`, for a handle this member did not spawn; the surface then
watches it like its own, so its subscribers get the terminal update).

Watching a handle costs one read of the shared journal, then a wait for the item's ``NOTIFY agentd_done``
(agentd.cluster.watch, heard by the member's listener) with the member's one read of every watched handle's
state every :data:`~agentd.cluster.watch.FALLBACK_POLL` as the fallback, so an end reaches subscribers on
every member at once without a poll per watched handle on the member's one connection.

Ownership (agentd.transport.tenancy): the spawning principal goes into the row's payload (``principal``), so
every member answers a cluster handle to its owner only (and to an operator); a row without one (enqueued
before owners were kept, or by an operator) is the operator's.

Limits: an async spawn here is a queued row, not a run of this member, so it is bounded by
``--serve-max-queued`` (this member's cluster spawns not yet ended), not by ``--serve-max-spawns`` (what this
member's supervisor runs for the served surface); what the cluster runs is bounded by ``--cluster-capacity``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final

import attrs
import trio

from agentd.cluster.errors import ClusterUnavailable
from agentd.cluster.store import PgJournal
from agentd.cluster.watch import FALLBACK_POLL, WAITER_FALLBACK, DoneWatch
from agentd.cluster.work import enqueue, request_cancel, view
from agentd.formats.ids import new_run_id
from agentd.journal.errors import JournalError
from agentd.journal.recorder import rebuild
from agentd.selfmcp.backend import Refusal, RunView, SelfMcpBackend, ServedSpawn

#: The prefix of a cluster-wide handle.
PREFIX: Final = "cluster."
#: The payload key of a spawn made as an MCP task: its ``createdAt`` (wall clock), the same on every member.
TASK_KEY: Final = "task_created"
#: How long ``subagent.cancel`` of a cluster handle waits for the run's end before answering its state, and
#: how often it re-reads meanwhile (the caller is waiting: a lost notification costs at most this).
CANCEL_WAIT: Final = 10.0
CANCEL_POLL: Final = 1.0


def is_cluster_handle(handle: str) -> bool:
    return handle.startswith(PREFIX)


def _payload(value: Any) -> Mapping[str, Any]:
    payload = json.loads(value) if isinstance(value, str | bytes) else value
    return payload if isinstance(payload, Mapping) else {}


def _principal(payload: Mapping[str, Any]) -> str:
    principal = payload.get("principal")
    return principal if isinstance(principal, str) else ""


def _task_created(payload: Mapping[str, Any]) -> float | None:
    created = payload.get(TASK_KEY)
    return float(created) if isinstance(created, int | float) and not isinstance(created, bool) else None


async def read_principal(store: PgJournal, handle: str) -> tuple[str, float | None]:
    """The principal that spawned a cluster handle ("" when none is recorded) and, for one spawned as an MCP
    task, its ``createdAt`` (wall clock), from its row's payload."""
    row = await store.db.call(lambda conn: conn.execute(
        "SELECT payload FROM agentd_work WHERE work_id = %s", (handle,)).fetchone(), "read")
    if row is None:
        return "", None
    payload = _payload(row[0])
    return _principal(payload), _task_created(payload)


async def read_tasks(store: PgJournal, principal: str | None, ended_since: float) -> list[str]:
    """The cluster handles spawned as MCP tasks by ``principal`` (None: by anyone) that have not ended, or
    ended after ``ended_since`` (wall clock), oldest first: what ``tasks/list`` shows on any member."""

    def work(conn: Any) -> list[Any]:
        return list(conn.execute(
            "SELECT work_id, payload FROM agentd_work WHERE kind = 'spawn' AND payload LIKE %s "
            "AND (finished_at IS NULL OR finished_at > %s) ORDER BY created_at", (f'%"{TASK_KEY}"%', ended_since),
        ).fetchall())

    rows = await store.db.call(work, "read")
    found = []
    for work_id, value in rows:
        payload = _payload(value)
        if _task_created(payload) is not None and (principal is None or _principal(payload) == principal):
            found.append(str(work_id))
    return found


async def read_view(store: PgJournal, handle: str) -> RunView | None:
    """A cluster handle's state from the shared journal: running until its row is done (one read), then its
    run's ``run.ended`` (a second read, once)."""
    seen = await view(store, handle)
    if seen is None:
        return None
    if seen.status != "done":  # its run.ended commits no later than the row is marked done
        return RunView(handle, "running", False)
    run = await store.read_run(handle)
    ended = rebuild(run).ended if run is not None else None
    if ended is None:
        return RunView(handle, "running", False)
    recorded: Mapping[str, Any] = ended.result if isinstance(ended.result, Mapping) else {}
    return RunView(handle, ended.status, True, bool(recorded.get("partial", False)), recorded.get("result"))


@attrs.define(eq=False)
class ClusterBackend:
    local: SelfMcpBackend
    store: PgJournal
    #: Woken by the member's listener when an item ends (None: no listener; the fallback re-read alone).
    watch: DoneWatch | None = None
    _views: dict[str, RunView] = attrs.field(factory=dict)
    #: Cluster handle -> the principal that spawned it (from the row's payload).
    _owners: dict[str, str] = attrs.field(factory=dict)
    #: Cluster handle -> createdAt (wall clock) of one spawned as an MCP task (from the row's payload).
    _tasks: dict[str, float] = attrs.field(factory=dict)
    _enqueued: int = 0

    def queues(self, request: ServedSpawn) -> bool:
        """Does this spawn become a queued cluster row (``--serve-max-queued``) rather than a local run?"""
        return request.detached and not request.warm

    async def spawn(self, request: ServedSpawn) -> str | Refusal:
        if not self.queues(request):
            return await self.local.spawn(request)
        if request.model is not None:  # a queued row runs as a member's own run, on that member's model
            return Refusal("spawn refused: an async spawn queued in the cluster runs on the members' own model; "
                           "leave out 'model' (or spawn it sync or warm)", cap="model")
        handle = PREFIX + new_run_id()
        payload: dict[str, Any] = {"instruction": request.instruction}
        if request.output_contract is not None:
            payload["output_contract"] = request.output_contract
        if request.owner:
            payload["principal"] = request.owner
        if request.task:
            payload[TASK_KEY] = time.time()
        try:
            await enqueue(self.store, handle, "spawn", payload)
        except JournalError as exc:
            return Refusal(f"spawn refused: the cluster database is unavailable ({exc})", cap="cluster",
                           retryable=isinstance(exc, ClusterUnavailable), retry_after=1.0)
        self._enqueued += 1
        self._views[handle] = RunView(handle, "running", False)
        self._owners[handle] = request.owner
        if request.task:
            self._tasks[handle] = payload[TASK_KEY]
        return handle

    async def send(self, handle: str, message: str) -> Refusal | None:
        return await self.local.send(handle, message)

    def forget(self, handle: str) -> None:
        if is_cluster_handle(handle):
            self._views.pop(handle, None)
            self._owners.pop(handle, None)
            self._tasks.pop(handle, None)
        else:
            self.local.forget(handle)

    def view(self, handle: str) -> RunView | None:
        return self._views.get(handle) if is_cluster_handle(handle) else self.local.view(handle)

    async def lookup(self, handle: str) -> RunView | None:
        """A cluster handle spawned on any member, from the shared journal (None: unknown, or unreachable)."""
        if not is_cluster_handle(handle):
            return None
        try:
            found = await read_view(self.store, handle)
            if found is not None:
                self._owners[handle], created = await read_principal(self.store, handle)
                if created is not None:
                    self._tasks[handle] = created
            return found
        except JournalError:
            return None

    def owner_of(self, handle: str) -> str:
        """The principal a cluster handle belongs to (known once spawned here or looked up)."""
        return self._owners.get(handle, "")

    def task_of(self, handle: str) -> float | None:
        """When a cluster handle was spawned as an MCP task (wall clock, the spawning member's), or None."""
        return self._tasks.get(handle)

    async def tasks(self, principal: str | None, ended_since: float) -> list[str]:
        """The cluster handles spawned as MCP tasks by ``principal`` (None: anyone's) on any member, not ended
        or ended after ``ended_since`` (``tasks/list``; none while the database is away)."""
        try:
            return await read_tasks(self.store, principal, ended_since)
        except JournalError:
            return []

    async def wait(self, handle: str) -> RunView:
        if not is_cluster_handle(handle):
            return await self.local.wait(handle)
        # With the member's listener, the member looks at every watched handle's state at once every
        # FALLBACK_POLL (agentd.cluster.member): this waiter reads its own only as a last resort.
        wait = FALLBACK_POLL if self.watch is None else WAITER_FALLBACK
        while True:
            seen = await self._until_done(handle, wait)
            if seen is not None:
                return seen

    async def _until_done(self, handle: str, wait: float) -> RunView | None:
        """Read the handle's state; not ended: wait (at most ``wait``) for its ``done`` notification. The
        terminal view, else None (read again)."""
        with self._watching(handle) as ended:
            try:
                seen = await read_view(self.store, handle)
            except JournalError:
                seen = None  # the database is away: keep waiting, it is retried
            if seen is not None:
                self._views[handle] = seen
                if seen.done:
                    return seen
            with trio.move_on_after(wait):
                await ended.wait()
        return None

    def _watching(self, handle: str) -> AbstractContextManager[trio.Event]:
        return self.watch.watching(handle) if self.watch is not None else nullcontext(trio.Event())

    async def wait_turns(self, handle: str, after: int) -> RunView:
        return await self.local.wait_turns(handle, after)

    async def cancel(self, handle: str) -> RunView | None:
        if not is_cluster_handle(handle):
            return await self.local.cancel(handle)
        try:
            await request_cancel(self.store, handle)
        except JournalError:
            return self._views.get(handle)
        # The owner cancels at its next heartbeat (a third of the lease TTL): wait for the end, bounded.
        with trio.move_on_after(CANCEL_WAIT):
            while True:
                seen = await self._until_done(handle, CANCEL_POLL)
                if seen is not None:
                    return seen
        return self._views.get(handle)

    def counts(self) -> Mapping[str, int]:
        return {**self.local.counts(), "cluster_enqueued": self._enqueued}
