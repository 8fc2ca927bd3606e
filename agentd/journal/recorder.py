"""One run's journal, written and read back: :class:`RunRecorder` commits what the loop did, :func:`rebuild`
turns the committed records into where a recovered run starts again.

Why here: the run composition (agentd.run) owns *when* a run is journaled; this module owns *what* a run's
records are and what they mean after a crash, with no knowledge of the loop's types (it sees plain JSON
messages, as the loop holds them). The loop calls the recorder through its narrow
:class:`agentd.agent.runner.StepJournal` hook:

- ``replied(step, message, ...)``: one batch per step, committed *before* any of the step's tool calls is
  sent (write-ahead): the assistant message, one ``ToolCallRequested`` per call, the step's usage;
- ``observed(step, call_id, ok, text)``: one call's observation, committed as soon as the loop made it;
- ``task_started(step, call_id, task_id)``: a call the server runs as a task, once the task exists;
- ``approval_pending`` / ``approval_decided``: a call marked ``approve`` waits for a person, and how they decided
  (a pending call never decided was never sent: the resumed run asks again);
- ``elicitation_pending`` / ``elicitation_decided``: a server's question during a call, and its answer (one never
  answered is :attr:`Rebuilt.unanswered`: its server request died with the process, the resumed run records it
  ``cancel``).

Which commits are durable (``durable=True``: flushed so that a crash of the store itself, the OS under
SQLite or PostgreSQL's server, keeps them, before the commit returns) follows what agentd does next OUTSIDE
the journal: a step that asks for tool calls (its calls are sent next), a call's task id (polled next),
and ``run.ended`` (the result is handed out next: stdout, a served client; a subagent's end that its parent run
takes as a tool call's outcome is not flushed: that run commits it, and acts outside only after a flush of its
own, :attr:`RunRecorder.parent_commits_end`). The other records
(``run.started``, an outcome, a final answer, a spawn, a child's end) are committed without waiting for a
flush: both stores write one log in commit order, so the next durable commit of the store (any run's, any
process's) secures them too, and nothing outside agentd acts on them before one. A power loss before it
loses them whole: a model call is made again (a re-asked reply) or a call's outcome is unknown (the call is
pending, and is never re-sent blindly), never a second send. A store groups the durable commits of
concurrent runs (agentd.journal.group).

So after a crash every tool call the journal knows of is in one of two states: its outcome committed (its
observation is replayed, the call is never re-sent) or *pending* (requested, no outcome: it may or may not
have reached the server). :func:`rebuild` reports the pending calls (with the task a call started, if any: the
loop polls that task again instead of calling the tool); the loop decides what to do with them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from agentd.journal.records import (
    ApprovalDecided,
    ApprovalPending,
    ChildResult,
    ElicitationDecided,
    ElicitationPending,
    ModelReply,
    RunEnded,
    RunStarted,
    Spawned,
    ToolCallOutcome,
    ToolCallRequested,
    ToolTaskStarted,
    Usage,
)
from agentd.journal.store import JournalStore, RunJournal
from agentd.telemetry.metrics import journal_commit, journal_queue


def config_digest(settings: Mapping[str, Any]) -> str:
    """A short, stable digest of a run's settings (``RunStarted.config_digest``); values are never stored."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


#: The result a lost child's ``child.result`` carries.
LOST_CHILD = "the parent process stopped while this subagent ran; it was not run again"
#: The status and result of a warm session a resumed parent cannot re-open.
INTERRUPTED = "interrupted"
INTERRUPTED_CHILD = ("the parent process stopped while this warm session was open; its conversation cannot be "
                     "resumed: spawn a new session if it is still needed")


@attrs.frozen
class PendingCall:
    """A requested tool call with no committed outcome."""

    step: int
    call_id: str
    name: str
    arguments: str
    #: The task the call started on its server (``tool.task``), if it became one.
    task_id: str | None = None
    #: A call marked ``approve``: ``approve`` or ``deny`` once a person decided (``approval.decided``), else None
    #: (never decided: it was never sent, and the resumed run asks again).
    approval: str | None = None
    #: The reason a person gave when denying it.
    reason: str | None = None


@attrs.frozen
class OpenChild:
    """An async child an earlier process of the run left running, whose own run is journaled (``run``): a
    resumed parent resumes it under the same handle, with the arguments of the call that spawned it."""

    handle: str
    run: str
    arguments: Mapping[str, Any]


@attrs.frozen
class Rebuilt:
    """A run as its journal has it: how it started, the conversation after the instruction, and where it is."""

    started: RunStarted | None
    ended: RunEnded | None
    messages: tuple[dict[str, Any], ...]
    steps: int
    prompt_tokens: int
    completion_tokens: int
    pending: tuple[PendingCall, ...]
    #: Subagents the run spawned whose end is not journaled (their processes did not survive a crash).
    open_children: tuple[str, ...] = ()
    #: Every subagent the run spawned, in order.
    children: tuple[str, ...] = ()
    #: The warm sessions among them.
    warm_children: frozenset[str] = frozenset()
    #: The open children that can resume (async, with a journaled run and the spawn call's arguments).
    resumable: tuple[OpenChild, ...] = ()
    #: Every journaled child's run id -> its handle (a spawn made again finds the child it started).
    child_runs: Mapping[str, str] = attrs.field(factory=dict)
    #: Servers' questions that waited for a person when the process stopped (no ``elicitation.decided``).
    unanswered: tuple[ElicitationPending, ...] = ()


def rebuild(journal: RunJournal) -> Rebuilt:
    """The committed conversation of ``journal`` (model replies and observations, in commit order)."""
    started: RunStarted | None = None
    ended: RunEnded | None = None
    messages: list[dict[str, Any]] = []
    requested: dict[str, PendingCall] = {}
    children: dict[str, None] = {}
    spawned: list[str] = []
    warm: set[str] = set()
    calls: dict[int, list[ToolCallRequested]] = {}  # every requested call, by step (a spawn's arguments)
    runs: dict[str, str] = {}
    async_runs: dict[str, OpenChild] = {}
    questions: list[ElicitationPending] = []
    steps = prompt = completion = 0
    for entry in journal.entries:
        record = entry.record
        if isinstance(record, RunStarted):
            started = record
        elif isinstance(record, ModelReply):
            message = record.message if isinstance(record.message, dict) else {"role": "assistant",
                                                                                "content": str(record.message)}
            messages.append(dict(message))
            steps = max(steps, record.step)
        elif isinstance(record, ToolCallRequested):
            arguments = record.arguments if isinstance(record.arguments, str) else json.dumps(record.arguments)
            requested[record.call_id] = PendingCall(record.step, record.call_id, record.name, arguments)
            calls.setdefault(record.step, []).append(record)
        elif isinstance(record, ToolTaskStarted):
            call = requested.get(record.call_id)
            if call is not None:
                requested[record.call_id] = attrs.evolve(call, task_id=record.task_id)
        elif isinstance(record, ApprovalDecided):
            call = requested.get(record.call_id)
            if call is not None:
                requested[record.call_id] = attrs.evolve(call, approval=record.action, reason=record.reason)
        elif isinstance(record, ElicitationPending):
            questions.append(record)
        elif isinstance(record, ElicitationDecided):
            for index, asked in enumerate(questions):  # the oldest open question of that call
                if asked.call_id == record.call_id and asked.step == record.step:
                    del questions[index]
                    break
        elif isinstance(record, ToolCallOutcome):
            requested.pop(record.call_id, None)
            messages.append({"role": "tool", "tool_call_id": record.call_id, "content": str(record.result)})
        elif isinstance(record, Usage):
            prompt += record.input_tokens
            completion += record.output_tokens
        elif isinstance(record, Spawned):
            children[record.handle] = None
            spawned.append(record.handle)
            if record.warm:
                warm.add(record.handle)
            if record.run is not None:
                runs[record.run] = record.handle
                spawn = _spawn_arguments(record, calls.get(record.step, ()))
                if spawn is not None and spawn.get("async") and not spawn.get("warm") and not record.warm:
                    async_runs[record.handle] = OpenChild(record.handle, record.run, spawn)
        elif isinstance(record, ChildResult):
            children.pop(record.handle, None)
        elif isinstance(record, RunEnded):
            ended = record
    return Rebuilt(started, ended, tuple(messages), steps, prompt, completion, tuple(requested.values()),
                   tuple(children), tuple(spawned), frozenset(warm),
                   tuple(async_runs[h] for h in children if h in async_runs), runs, tuple(questions))


def _spawn_arguments(spawn: Spawned, calls: Sequence[ToolCallRequested]) -> Mapping[str, Any] | None:
    """The arguments of the call that started ``spawn``'s child: the one whose id its run ends with
    (``PARENT/STEP.CALL``, agentd.supervisor.graph.child_run); None if none (a graph node)."""
    for call in calls:
        if spawn.run is not None and spawn.run.endswith(f"/{call.step}.{call.call_id}"):
            try:
                arguments = call.arguments if isinstance(call.arguments, dict) else json.loads(call.arguments or "{}")
            except (TypeError, ValueError):
                return None
            return arguments if isinstance(arguments, dict) else None
    return None


@attrs.define(eq=False)
class RunRecorder:
    """Commits one run's records to a :class:`JournalStore` (the loop's ``StepJournal``)."""

    store: JournalStore
    run_id: str
    _children_ended: set[str] = attrs.field(factory=set, init=False)
    #: The handles of the children an earlier process of this run spawned (set when it is resumed).
    earlier_children: tuple[str, ...] = ()
    #: How each child an earlier process left running ended for this run (:meth:`lost`): status and result.
    _earlier_ends: dict[str, tuple[str, str]] = attrs.field(factory=dict, init=False)
    #: The async children an earlier process left running that resume with the run (set when it is resumed;
    #: :meth:`resumable_children` hands them out once).
    resumable: tuple[OpenChild, ...] = ()
    #: Every child an earlier process spawned with a journaled run: run id -> handle.
    child_runs: Mapping[str, str] = attrs.field(factory=dict)
    #: The run started in this process (not resumed): no earlier process journaled a child of it, so each child
    #: it spawns is told its run is new (agentd.run.journal_run skips that child's resume check).
    new: bool = False
    #: The run is a subagent's whose end its parent run takes as a tool call's outcome and commits itself
    #: (``child.result``) before anything acts on it outside agentd: ``run.ended`` is committed without a flush
    #: (:meth:`ended`).
    parent_commits_end: bool = False
    #: Records held for the run's next commit: ``run.started`` of a run its parent said is new (:meth:`started`),
    #: the final answer of a run whose parent commits its end (:meth:`replied`).
    _deferred: list[Any] = attrs.field(factory=list, init=False)

    def resumable_children(self) -> tuple[OpenChild, ...]:
        """The async children to resume under their handles (once: a second call gets none)."""
        found, self.resumable = self.resumable, ()
        return found

    def child_of_run(self, run: str) -> str | None:
        """The handle an earlier process gave the child that journals ``run`` (a spawn made again), or None."""
        return self.child_runs.get(run)

    def journaled_children(self) -> tuple[str, ...]:
        return self.earlier_children

    def earlier_end(self, handle: str) -> tuple[str, str] | None:
        """The status and result of ``handle`` if an earlier process of this run left it running (it died with
        that process): what a ``subagent.*`` call on it answers, instead of an unknown handle."""
        return self._earlier_ends.get(handle)

    async def started(self, record: RunStarted, *, deferred: bool = False) -> None:
        """Not flushed: the run's first durable commit (a step with tool calls, its end) secures it.

        ``deferred`` (a child whose parent knows the run is new): kept until the run's first commit and
        committed in its batch, one transaction less. A child killed before that commit leaves no trace of its
        run, which is what its resumed parent's spawn starts again anyway; the store refuses the batch if the
        run turns out to be journaled already (nothing of it written)."""
        self.new = True
        if deferred:
            self._deferred = [record]
            return
        await self._append([record])

    async def commit_started(self) -> None:
        """Commit what is held (a deferred ``run.started``, a held final answer) now if no batch carried it yet (a
        run cancelled before its first commit is still recorded as started, then ended as its cancellation
        decides; a drained run keeps its last answer)."""
        if self._deferred:
            await self._append([])

    async def replied(self, step: int, message: Mapping[str, Any], prompt_tokens: int,
                      completion_tokens: int) -> None:
        ended = time.perf_counter()  # the step's model call just ended: its lag runs from here to the commit
        calls: Sequence[Mapping[str, Any]] = message.get("tool_calls") or ()
        records: list[Any] = [ModelReply(step, dict(message))]
        for call in calls:
            function = call.get("function") or {}
            records.append(ToolCallRequested(step, str(call.get("id")), str(function.get("name")),
                                             function.get("arguments")))
        records.append(Usage(step, prompt_tokens, completion_tokens))
        if not calls and self.parent_commits_end:
            # A subagent's final answer, which nothing outside acts on: committed with its ``run.ended``, which
            # the run commits next (one transaction less for each of a fan-out's children). Killed in between,
            # the resumed child asks the model again, as after a power loss before a flush; a run that goes on
            # instead (an answer its output contract refused) commits it with its next step.
            self._deferred.extend(records)
            return
        await self._append(records, durable=bool(calls))
        journal_commit(time.perf_counter() - ended)

    async def observed(self, step: int, call_id: str, ok: bool, text: str) -> None:
        """Not flushed: only the model sees it before the next durable commit (lost to a power loss, the call is
        pending after a restart: unknown, or re-sent under its key if idempotent, as after a crash mid-call)."""
        await self._append([ToolCallOutcome(step, call_id, ok, text)])

    async def task_started(self, step: int, call_id: str, task_id: str) -> None:
        """A call became a task on its server: committed (durably) before agentd polls it."""
        await self._append([ToolTaskStarted(step, call_id, task_id)], durable=True)

    async def approval_pending(self, step: int, call_id: str, server: str, tool: str,
                               arguments: Mapping[str, Any]) -> None:
        """A call waits for a person: committed (durably) before the wait, so a crash leaves it asked again."""
        await self._append([ApprovalPending(step, call_id, server, tool, dict(arguments))], durable=True)

    async def approval_decided(self, step: int, call_id: str, action: str, reason: str | None) -> None:
        """A person decided: committed (durably) before an approved call is sent."""
        await self._append([ApprovalDecided(step, call_id, action, reason)], durable=True)

    async def elicitation_pending(self, step: int, call_id: str, server: str, message: str,
                                  schema: Mapping[str, Any]) -> None:
        """A server's question waits for a person: committed (durably) before the wait."""
        await self._append([ElicitationPending(step, call_id, server, message, dict(schema))], durable=True)

    async def elicitation_decided(self, step: int, call_id: str, action: str, content: Mapping[str, Any] | None,
                                  reason: str | None = None) -> None:
        """How it was settled (an answer's values included): committed (durably) before the server is answered."""
        await self._append([ElicitationDecided(step, call_id, action, dict(content) if content is not None else None,
                                               reason)], durable=True)

    async def spawned(self, step: int, handle: str, instruction: str, budget: int | None,
                      run: str | None = None, warm: bool = False, ended: tuple[str, Any] | None = None) -> None:
        """A subagent the run started (``subagent.spawn``): its handle, instruction, token slice, the run id
        it journals its own steps under, and whether it is a warm session; with ``ended`` (status, result: a
        synchronous spawn, over when it is journaled) its end in the same commit (:meth:`child_ended`)."""
        records: list[Any] = [Spawned(step, handle, instruction, budget, run, warm)]
        if ended is not None and handle not in self._children_ended:
            self._children_ended.add(handle)
            records.append(ChildResult(handle, *ended))
        await self._append(records)

    async def child_ended(self, handle: str, status: str, result: Any) -> None:
        """A subagent's end, committed the first time the run sees it (a later status call adds nothing)."""
        if handle not in self._children_ended:
            self._children_ended.add(handle)
            await self._append([ChildResult(handle, status, result)])

    async def lost(self, handles: Sequence[str], warm: frozenset[str] = frozenset(), reason: str = "") -> None:
        """Children a crash left without an end: their processes died with the parent; recorded ``lost`` (a warm
        session among ``warm``: ``interrupted``, its conversation cannot be re-opened; ``reason``: why an async
        one could not resume)."""
        self._children_ended.update(handles)
        for h in handles:
            self._earlier_ends[h] = (INTERRUPTED, INTERRUPTED_CHILD) if h in warm else (
                "lost", f"{LOST_CHILD} ({reason})" if reason else LOST_CHILD)
        await self._append([ChildResult(h, *self._earlier_ends[h]) for h in handles])

    async def ended(self, status: str, result: Any, error: str | None) -> None:
        """Flushed before the result is handed out (stdout, a served client), unless it goes to a parent run that
        commits it (:attr:`parent_commits_end`): that run acts outside agentd only after a flushed commit of its
        own (a step with tool calls, its end), which secures this one too (one log in commit order), and a
        power loss before it leaves both runs as they were at the last flush: the parent's spawn is made again
        and this run resumes from its journal, as after a crash in its last step."""
        await self._append([RunEnded(status, result, error)], durable=not self.parent_commits_end)

    async def _append(self, records: Sequence[Any], *, durable: bool = False) -> None:
        if self._deferred:
            records = [*self._deferred, *records]
        journal_queue(+1)  # waiting for the store or being committed
        try:
            await self.store.append(self.run_id, records, durable=durable)
        finally:
            journal_queue(-1)
        self._deferred = []


__all__ = ["INTERRUPTED", "INTERRUPTED_CHILD", "LOST_CHILD", "OpenChild", "PendingCall", "Rebuilt", "RunRecorder", "config_digest",
           "rebuild"]
