"""Served handles that survive a restart (``--serve-mcp`` with ``--state-dir``).

Why a backend: the served surface talks to its runs only through
:class:`~agentd.selfmcp.backend.SelfMcpBackend`. :class:`JournaledBackend` wraps the supervisor's backend and
keeps each ``served.N`` handle in the journal's daemon state (namespace :data:`NAMESPACE`): its instruction,
whether it is a warm session, its status and, once it ended, its result; a warm session also keeps its
history (each turn's message and answer). A started handle is saved before the peer gets it; an ended one
until the surface's retention forgets it.

After a restart (:meth:`JournaledBackend.restore`), ``subagent.status`` and ``resources/read`` of a journaled
handle answer again (:meth:`lookup`, which the surface asks for a handle it does not know). The subagent
processes died with their parent, but an async run's child journals its own steps in the tree's journal under
the run id kept with its handle (``Kept.run``), so:

- an async run that was in flight is *resumed* at start-up: a new child runs under the same journaled run id,
  continues from its last committed step (a non-idempotent call it had in flight is reported to its model as
  unknown, never sent again) or, if it had ended, answers its recorded result, and the handle answers
  ``subagent.status``/``await`` with that result when it ends; in the same token budget tree. Only a run with no
  journaled run id (kept by an older agentd) or one whose re-spawn is refused ends ``lost``;
- a warm session comes back idle (``awaiting_turn``) with its history: the next ``subagent.send`` re-opens it
  (a new child seeded with the history, answering that message), under the same handle, in the same token
  budget tree (``served.N``'s saved books, agentd.supervisor.caps): what it spent before the crash stays spent.
  A turn that was in flight is not answered: the session says so in its ``result``. A warm session whose first
  turn never answered has nothing to continue from: it ends ``interrupted`` with the reason.

New handles are numbered after the journaled ones, so a handle never names two runs. Each handle keeps the
principal that spawned it (``owner``, agentd.transport.tenancy), so after a restart it is still that principal's
only; a handle journaled before owners were kept has none, and is the operator's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Final

import attrs
import trio

from agentd import defaults
from agentd.formats.ids import new_run_id
from agentd.journal.errors import JournalError
from agentd.journal.ledger import SERVED_NAMESPACE, drop_ledgers_except
from agentd.journal.store import JournalStore
from agentd.selfmcp.backend import Refusal, RunView, ServedSpawn
from agentd.selfmcp.supervised import MANAGEMENT, SupervisorBackend
from agentd.supervisor.caps import Refusal as SupervisorRefusal
from agentd.supervisor.supervisor import Caller, SpawnRequest, Supervisor
from agentd.telemetry.events import EventLog
from agentd.transport.tenancy import Owners

#: The daemon-state namespace of served handles, by handle.
NAMESPACE: Final = "serve.handles"
#: What a run in flight at a restart ends as (a terminal status).
LOST: Final = "lost"
LOST_REASON: Final = ("the daemon restarted while this run was in flight; its outcome is unknown and it was not "
                      "run again")
#: What a warm session that cannot continue ends as, and why.
INTERRUPTED: Final = "interrupted"
INTERRUPTED_REASON: Final = ("the daemon restarted before this session answered its first message: there is no "
                             "conversation to continue; spawn it again")
#: A re-opened warm session's ``result`` when its turn in flight at the restart was not answered.
UNANSWERED: Final = ("the daemon restarted while this session answered {message!r}; that turn was lost: send it "
                     "again")


@attrs.define(eq=False)
class Kept:
    """One served handle as the journal keeps it, and where it runs now."""

    handle: str
    warm: bool
    instruction: str
    output_contract: str | None = None
    tool_scope: tuple[str, ...] | None = None
    status: str = "running"
    done: bool = False
    partial: bool = False
    result: Any = None
    turns: int | None = None
    history: list[dict[str, Any]] = attrs.field(factory=list)
    ended_at: float | None = None  # wall clock: an ended handle is forgotten ``retention`` after it
    #: The principal that spawned it ("": the listener's single principal, or journaled before owners were).
    owner: str = ""
    #: The supervisor's handle running it now: itself, a re-opened session's, or None (not running here).
    live: str | None = None
    #: Turns answered before a re-open (the re-opened child counts from 1 again).
    offset: int = 0
    pending: str | None = None  # a message sent, its turn not answered yet
    reopened: trio.Event = attrs.field(factory=trio.Event)
    #: The run id an async run's child journals its steps under (resumed from it after a restart).
    run: str | None = None
    #: Spawned as an MCP task (``tasks/list`` after a restart), and when (wall clock; its ``createdAt``).
    task: bool = False
    created_at: float | None = None
    #: The model the spawn chose (``subagent.spawn``'s ``model``): a resumed or re-opened child calls it too.
    model: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"warm": self.warm, "instruction": self.instruction, "output_contract": self.output_contract,
                "tool_scope": list(self.tool_scope) if self.tool_scope is not None else None,
                "status": self.status, "done": self.done, "partial": self.partial, "result": self.result, "turns": self.turns,
                "history": self.history, "ended_at": self.ended_at, "owner": self.owner, "run": self.run,
                "pending": self.pending, "task": self.task, "created_at": self.created_at,
                **({"model": self.model} if self.model is not None else {})}

    @classmethod
    def from_json(cls, handle: str, data: Mapping[str, Any]) -> Kept:
        scope = data.get("tool_scope")
        return cls(handle, bool(data.get("warm")), str(data.get("instruction", "")),
                   data.get("output_contract") if isinstance(data.get("output_contract"), str) else None,
                   tuple(str(s) for s in scope) if isinstance(scope, list) else None,
                   str(data.get("status", "running")), bool(data.get("done")), bool(data.get("partial")), data.get("result"),
                   data.get("turns") if isinstance(data.get("turns"), int) else None,
                   [m for m in data.get("history") or () if isinstance(m, dict)],
                   data.get("ended_at") if isinstance(data.get("ended_at"), (int, float)) else None,
                   owner=data["owner"] if isinstance(data.get("owner"), str) else "",
                   pending=data.get("pending") if isinstance(data.get("pending"), str) else None,
                   run=data.get("run") if isinstance(data.get("run"), str) else None,
                   task=data.get("task") is True,
                   created_at=data.get("created_at") if isinstance(data.get("created_at"), (int, float)) else None,
                   model=data.get("model") if isinstance(data.get("model"), str) else None)

    def view(self) -> RunView:
        return RunView(self.handle, self.status, self.done, self.partial, self.result, self.turns)


def _turn(message: str, result: Any) -> list[dict[str, Any]]:
    """One answered turn as the child's history holds it (agentd.child.turn)."""
    return [{"role": "user", "content": message},
            {"role": "assistant", "content": json.dumps(result, ensure_ascii=False, default=str)}]


@attrs.define(eq=False)
class JournaledBackend:
    local: SupervisorBackend
    store: JournalStore
    log: EventLog
    #: How long an ended handle still answers (``--serve-retention``): older ones are dropped at a restart.
    retention: float = defaults.SERVE_RETENTION
    #: The served handles' owners (the surface shares it): a re-opened session's new child is its owner's too,
    #: so the owner's ``/events`` carries its lines.
    owners: Owners = attrs.field(factory=Owners)
    _kept: dict[str, Kept] = attrs.field(factory=dict)

    @property
    def supervisor(self) -> Supervisor:
        """The served A2A surface (``--serve-a2a``) uses the supervisor itself, as with no journal."""
        return self.local.supervisor

    async def restore(self) -> None:
        """Read the handles an earlier process kept: async runs in flight resume from their journaled runs (or end
        ``lost`` without one), warm sessions wait idle (or end ``interrupted`` with nothing to continue)."""
        try:
            saved = await self.store.get_state(NAMESPACE)
        except JournalError as exc:
            self.log.warn("journal.write_failed", namespace=NAMESPACE, error=str(exc))
            return
        highest, now, resumed = 0, time.time(), []
        for handle, data in saved.items():
            number = handle.removeprefix("served.")
            highest = max(highest, int(number) if number.isdigit() else 0)
            kept = Kept.from_json(handle, data) if isinstance(data, Mapping) else None
            if kept is None or (kept.done and (kept.ended_at or 0) + self.retention < now):
                await self._drop(handle)  # past its retention: unknown, as without a restart
                continue
            self._kept[handle] = kept
            if kept.done:
                continue
            if kept.warm and kept.history:
                kept.status = "awaiting_turn"
                if kept.pending is not None:  # its turn in flight is not answered: say so, not silently idle
                    kept.result, kept.pending = UNANSWERED.format(message=kept.pending[:200]), None
            elif kept.warm:
                kept.status, kept.done, kept.result, kept.ended_at = INTERRUPTED, True, INTERRUPTED_REASON, now
                kept.pending = None
            elif kept.run is not None:
                resumed.append(kept)
                continue
            else:
                kept.status, kept.done, kept.result, kept.ended_at = LOST, True, LOST_REASON, now
            self.log.info("serve.restored", handle=handle, status=kept.status, turns=kept.turns)
            await self._save(kept)
        ledger = getattr(self.local.supervisor.authority, "ledger", None)
        if ledger is not None:
            ledger.mint_after("served", highest)
        for kept in resumed:  # after the numbering: the new children's handles never name a journaled one
            await self._resume(kept, now)
        try:  # only an idle warm session continues its tree: the other served trees' books are over
            await drop_ledgers_except(self.store, {h for h, k in self._kept.items() if not k.done},
                                      namespace=SERVED_NAMESPACE)
        except JournalError as exc:
            self.log.warn("journal.write_failed", namespace=SERVED_NAMESPACE, error=str(exc))

    async def _resume(self, kept: Kept, now: float) -> None:
        """An async run an earlier process left in flight: a new child resumes its journaled run (or replays its
        recorded end), in the same token budget tree; its end is kept when it comes."""
        continued = Caller(MANAGEMENT.origin, MANAGEMENT.handle, tree=kept.handle)
        answer = await self.local.supervisor.spawn(continued, SpawnRequest(
            instruction=kept.instruction, output_contract=kept.output_contract, tool_scope=kept.tool_scope,
            async_=True, journal_run=kept.run, model=kept.model))
        if isinstance(answer, SupervisorRefusal):
            kept.status, kept.done, kept.result, kept.ended_at = LOST, True, f"{LOST_REASON} ({answer.message})", now
            self.log.info("serve.restored", handle=kept.handle, status=kept.status, run=kept.run)
            await self._save(kept)
        else:
            kept.live, kept.status = answer.handle, "running"
            self.log.info("serve.restored", handle=kept.handle, status="resumed", live=answer.handle, run=kept.run)
            self.local.supervisor.nursery.start_soon(self._settle, kept)
        kept.reopened.set()

    async def _settle(self, kept: Kept) -> None:
        """Keep a resumed run's end when it comes (whether or not a peer is watching the handle)."""
        if kept.live is not None:
            await self._record(kept, self._from_live(kept, await self.local.wait(kept.live)))

    async def _save(self, kept: Kept) -> None:
        if kept.done and kept.ended_at is None:
            kept.ended_at = time.time()
        try:
            await self.store.put_state(NAMESPACE, {kept.handle: kept.to_json()})
        except JournalError as exc:  # the handle goes on; it will not answer after a restart
            self.log.warn("journal.write_failed", namespace=NAMESPACE, error=str(exc))

    def _from_live(self, kept: Kept, view: RunView) -> RunView:
        turns = view.turns + kept.offset if view.turns is not None else kept.turns
        return attrs.evolve(view, handle=kept.handle, turns=turns)

    async def _record(self, kept: Kept, view: RunView, *, save: bool = False) -> RunView:
        """Keep what ``view`` (translated) says: an answered turn's history, or the end."""
        changed = False
        if kept.warm and view.turns is not None and view.turns > (kept.turns or 0) and kept.pending is not None:
            kept.history.extend(_turn(kept.pending, view.result))
            kept.pending, changed = None, True
        if view.turns is not None and view.turns != kept.turns:
            kept.turns, changed = view.turns, True
        settled = view.done or (kept.warm and view.status == "awaiting_turn")
        now = (view.status, view.done, view.partial, view.result)
        if settled and (kept.status, kept.done, kept.partial, kept.result) != now:
            (kept.status, kept.done, kept.partial, kept.result), changed = now, True
        if changed or save:
            await self._save(kept)
        return view

    # -- SelfMcpBackend -------------------------------------------------------------------------------------

    async def spawn(self, request: ServedSpawn) -> str | Refusal:
        # An async run's child journals its own steps (a warm session is a conversation: it is re-opened instead).
        run = None if request.warm or self.local.supervisor.journal_dir is None else f"served/{new_run_id()}"
        answer = await self.local.spawn(request, journal_run=run)
        if isinstance(answer, Refusal):
            return answer
        kept = self._kept[answer] = Kept(answer, request.warm, request.instruction, request.output_contract,
                                         request.tool_scope, live=answer, pending=request.instruction,
                                         owner=request.owner, run=run, task=request.task, created_at=time.time(),
                                         model=request.model)
        kept.reopened.set()
        now = self.local.view(answer)
        await self._record(kept, now or kept.view(), save=True)  # before the peer gets the handle
        return answer

    async def send(self, handle: str, message: str) -> Refusal | None:
        kept = self._kept.get(handle)
        if kept is None:
            return await self.local.send(handle, message)
        if kept.live is None and not kept.done:
            if kept.pending is not None:
                return Refusal(f"{handle} is re-opening: its last message has not been answered yet")
            kept.pending, kept.status = message, "running"
            await self._save(kept)  # a restart before the answer says the turn was lost (never silently idle)
            self.local.supervisor.nursery.start_soon(self._reopen, kept, message)
            return None
        answer = await self.local.send(kept.live or handle, message)
        if answer is None:
            kept.pending = message
            await self._save(kept)
        return answer

    async def _reopen(self, kept: Kept, message: str) -> None:
        """A journaled warm session's next message: a new child seeded with its history answers it."""
        continued = Caller(MANAGEMENT.origin, MANAGEMENT.handle, tree=kept.handle)  # its earlier budget tree
        claims = self.owners.claims(kept.owner)  # the new child's lines are the session owner's from the first
        answer = await self.local.supervisor.spawn(continued, SpawnRequest(
            instruction=message, output_contract=kept.output_contract, tool_scope=kept.tool_scope, warm=True,
            history=tuple(kept.history), on_admitted=claims, model=kept.model))
        if isinstance(answer, SupervisorRefusal):
            claims.release()
            kept.status, kept.done, kept.result, kept.pending = "failed", True, answer.message, None
        else:
            kept.live, kept.offset = answer.handle, kept.turns or 0
            self.log.info("serve.restored", handle=kept.handle, status="reopened", live=answer.handle,
                          turns=kept.turns)
            await self._record(kept, self._from_live(kept, answer))
        kept.reopened.set()
        if kept.done:
            await self._save(kept)

    def forget(self, handle: str) -> None:
        kept = self._kept.pop(handle, None)
        if kept is None:
            self.local.forget(handle)
            return
        self.local.forget(kept.live or handle)
        if kept.live is not None and kept.live != handle:
            self.owners.forget(kept.live)
        self.local.supervisor.nursery.start_soon(self._drop, handle)

    async def _drop(self, handle: str) -> None:
        try:
            await self.store.put_state(NAMESPACE, {handle: None})
        except JournalError as exc:
            self.log.warn("journal.write_failed", namespace=NAMESPACE, error=str(exc))

    def view(self, handle: str) -> RunView | None:
        kept = self._kept.get(handle)
        if kept is None:
            return self.local.view(handle)
        if kept.live is None or kept.done:
            return kept.view()
        live = self.local.view(kept.live)
        return self._from_live(kept, live) if live is not None else kept.view()

    def owner_of(self, handle: str) -> str:
        """The principal a journaled handle belongs to (the surface asks along with :meth:`lookup`)."""
        kept = self._kept.get(handle)
        return kept.owner if kept is not None else ""

    def task_of(self, handle: str) -> float | None:
        """When a journaled handle was spawned as an MCP task (wall clock), or None if it was not one."""
        kept = self._kept.get(handle)
        return (kept.created_at or 0.0) if kept is not None and kept.task else None

    def handles(self) -> list[str]:
        """Every journaled handle: the surface tracks them at start-up, so each end becomes a served event."""
        return list(self._kept)

    def spawned_at(self, handle: str) -> float | None:
        """When a journaled handle was spawned (wall clock), if the journal says."""
        kept = self._kept.get(handle)
        return kept.created_at if kept is not None else None

    async def tasks(self, principal: str | None, ended_since: float) -> list[str]:
        """The journaled handles spawned as MCP tasks (``tasks/list`` asks after a restart; the surface keeps
        the caller's own, and an ended one for as long as it keeps any)."""
        return [handle for handle, kept in self._kept.items() if kept.task]

    async def lookup(self, handle: str) -> RunView | None:
        """A handle an earlier process journaled (the surface asks for a handle it does not track)."""
        return self.view(handle) if handle in self._kept else None

    async def wait(self, handle: str) -> RunView:
        kept = self._kept.get(handle)
        if kept is None:
            return await self.local.wait(handle)
        while not kept.done:
            await kept.reopened.wait()
            if kept.live is None:
                break
            return await self._record(kept, self._from_live(kept, await self.local.wait(kept.live)))
        return kept.view()

    async def wait_turns(self, handle: str, after: int) -> RunView:
        kept = self._kept.get(handle)
        if kept is None:
            return await self.local.wait_turns(handle, after)
        if not kept.done:
            await kept.reopened.wait()
        if kept.live is None or kept.done:
            return kept.view()
        view = await self.local.wait_turns(kept.live, max(0, after - kept.offset))
        return await self._record(kept, self._from_live(kept, view))

    async def cancel(self, handle: str) -> RunView | None:
        kept = self._kept.get(handle)
        if kept is None:
            return await self.local.cancel(handle)
        if kept.live is None:
            if not kept.done:  # an idle journaled session: nothing runs, it just ends
                kept.status, kept.done = "cancelled", True
                kept.reopened.set()
                await self._save(kept)
            return kept.view()
        view = await self.local.cancel(kept.live)
        return await self._record(kept, self._from_live(kept, view)) if view is not None else None

    def counts(self) -> Mapping[str, int]:
        return self.local.counts()
