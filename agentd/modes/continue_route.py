"""``--continue <uri>``: route a URI's updates into one warm session, in order, instead of fresh runs.

Spawn versus continue: an update of a ``--continue`` URI is owned by the route, never by a fresh wake
(exactly one owner per update). The router still coalesces per URI (one running, one pending), and
the route feeds its session one message at a time in arrival order, each built from a fresh
``resources/read`` made just before the message is sent (notify-then-read, as for wakes).

The session is anything with ``send(message)``; :class:`ConversationSession` is the in-process one:
each message is a turn of an ordinary daemon run seeded with the earlier turns (capped), so the agent
remembers what it did for earlier updates.

With ``--state-dir`` the journal is the session's transcript: each turn is its own journaled run, and its
``RunStarted`` names the runs of the earlier turns its seed is made of (``seed_runs``: references, not a copy,
so a turn's record stays small however long the answers are). At start-up :func:`restore_session` rebuilds
the session from the newest turn: its seed runs' messages and answers, plus the newest turn itself once it
ended; a turn a crash left unfinished is resumed first (:meth:`ConversationSession.recover`), from exactly
that seed and its own committed steps, and then joins the history like any answered turn.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs
import trio

from agentd.modes.router import Wake
from agentd.modes.runs import DaemonRuns, Job
from agentd.modes.wake_prompt import continue_message
from agentd.modes.watch import ResourcePool, read_current
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog

if TYPE_CHECKING:
    from agentd.journal.recorder import Rebuilt
    from agentd.journal.store import JournalStore

#: Earlier turns a conversation keeps as its seed (user + assistant message each).
MAX_SEED_TURNS: Final = 20


class WarmSession(Protocol):
    async def send(self, message: str, *, uri: str | None = None) -> Any: ...

    async def recover(self) -> None:
        """Finish the turn an earlier process left unfinished, if any (before the next ``send``)."""


OpenSession = Callable[[str], AbstractAsyncContextManager[WarmSession]]


@attrs.frozen
class Turn:
    """One answered turn of a session: its run, the message the session sent and the answer it got."""

    run_id: str
    message: str
    answer: str

    def messages(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {"role": "user", "content": self.message}, {"role": "assistant", "content": self.answer}


def answer_of(result: Any) -> str:
    """What a turn's result is in the conversation: its text (anything else by its ``repr``)."""
    return result if isinstance(result, str) else repr(result)


def seed_of(turns: Sequence[Turn]) -> tuple[Mapping[str, Any], ...]:
    return tuple(m for turn in turns for m in turn.messages())


@attrs.frozen
class Restored:
    """A session as the journal has it: its answered turns (the last :data:`MAX_SEED_TURNS`) and the turn an
    earlier process left unfinished, as the job that resumes it (its seed is ``turns``)."""

    turns: tuple[Turn, ...] = ()
    interrupted: Job | None = None


@attrs.define(eq=False)
class ConversationSession:
    """A warm session inside this process: each ``send`` is one run continuing the conversation."""

    runs: DaemonRuns
    instruction: str
    history: list[Turn] = attrs.field(factory=list)
    #: A turn an earlier process left unfinished: :meth:`recover` finishes it before the next message.
    interrupted: Job | None = None

    async def send(self, message: str, *, uri: str | None = None) -> Any:
        text = message if self.history else f"{self.instruction}\n\n---\n{message}"
        return await self._turn(Job("continue", text, uri, seed=seed_of(self.history),
                                    seed_runs=tuple(t.run_id for t in self.history)))

    async def recover(self) -> None:
        job, self.interrupted = self.interrupted, None
        if job is not None:
            await self._turn(job)

    async def _turn(self, job: Job) -> Any:
        result = await self.runs.run(job)
        if result is not None:
            self.history.append(Turn(result.run_id, job.instruction, answer_of(result.result)))
            del self.history[: max(0, len(self.history) - MAX_SEED_TURNS)]
            # Journal retention must not remove a turn the next one is seeded from (a restart restores them).
            await self.runs.keep_runs("continue", [turn.run_id for turn in self.history])
        return result


def conversation_sessions(runs: DaemonRuns, restored: Restored | None = None) -> OpenSession:
    """Open :class:`ConversationSession` s; the first one opened continues ``restored`` (``--state-dir``)."""
    kept = [restored] if restored is not None else []

    @contextlib.asynccontextmanager
    async def open_session(instruction: str) -> AsyncIterator[WarmSession]:
        earlier = kept.pop() if kept else Restored()
        yield ConversationSession(runs, instruction, list(earlier.turns), earlier.interrupted)

    return open_session


# --- the session in the journal (--state-dir) -------------------------------------------------------------------


def _answered(run_id: str, state: Rebuilt) -> Turn | None:
    """The turn a journaled run answered: its message and its result (a run with no end, say drained, by its
    last reply with text, as its result was); None for a run that never started."""
    if state.started is None:
        return None
    if state.ended is not None:
        body = state.ended.result
        return Turn(run_id, state.started.instruction, answer_of(body.get("result") if isinstance(body, Mapping)
                                                                 else None))
    said = [m.get("content") for m in state.messages
            if m.get("role") == "assistant" and str(m.get("content") or "").strip()]
    return Turn(run_id, state.started.instruction, answer_of(said[-1] if said else None))


async def turns_of(journal: JournalStore, run_ids: Sequence[str]) -> list[Turn]:
    """The turns the runs ``run_ids`` answered, in that order (a run retention removed is left out)."""
    from agentd.journal.recorder import rebuild

    turns = []
    for run_id in run_ids:
        prior = await journal.read_run(run_id)
        turn = _answered(run_id, rebuild(prior)) if prior is not None else None
        if turn is not None:
            turns.append(turn)
    return turns


async def resume_job(journal: JournalStore, run_id: str, state: Rebuilt) -> Job:
    """The job resuming the unfinished run ``run_id``: a ``--continue`` turn's starts from its seed again."""
    assert state.started is not None
    if state.started.seed_runs is None:
        return Job("resume", state.started.instruction, resume=run_id)
    return _resuming(run_id, state, await turns_of(journal, state.started.seed_runs))


def _resuming(run_id: str, state: Rebuilt, turns: Sequence[Turn]) -> Job:
    assert state.started is not None
    return Job("resume", state.started.instruction, seed=seed_of(turns), seed_runs=state.started.seed_runs,
               resume=run_id)


async def restore_session(journal: JournalStore, run_ids: Sequence[str]) -> Restored:
    """The session the newest ``--continue`` turn among ``run_ids`` (newest first) leaves: its seed's turns and,
    once it ended, itself; unfinished, it is the interrupted turn (resumed from that seed). Reads back to the
    newest turn only."""
    from agentd.journal.recorder import rebuild

    for run_id in run_ids:
        prior = await journal.read_run(run_id)
        state = rebuild(prior) if prior is not None else None
        if state is None or state.started is None or state.started.seed_runs is None:
            continue
        turns = await turns_of(journal, state.started.seed_runs)
        if state.ended is None:
            return Restored(tuple(turns), _resuming(run_id, state, turns))
        last = _answered(run_id, state)
        assert last is not None
        return Restored(tuple([*turns, last][-MAX_SEED_TURNS:]))
    return Restored()


@attrs.define(eq=False)
class _Item:
    wake: Wake
    done: trio.Event = attrs.field(factory=trio.Event)
    error: BaseException | None = None


@attrs.define(eq=False)
class ContinueRoute:
    open_session: OpenSession
    pool: ResourcePool
    instruction: str
    log: EventLog
    fed: int = 0
    _owned: set[str] = attrs.field(factory=set, init=False)
    _send: trio.MemorySendChannel[_Item] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[_Item] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # Unbounded is safe: the router allows one running wake per URI, so at most one item per URI waits.
        self._send, self._receive = trio.open_memory_channel[_Item](float("inf"))

    def own(self, uri: str) -> None:
        self._owned.add(uri)

    def owns(self, uri: str) -> bool:
        return uri in self._owned

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the session open and feed it, one item at a time, in arrival order."""
        async with self.open_session(self.instruction) as session:
            task_status.started()
            try:
                await session.recover()
            except Exception as exc:  # logged; the session goes on with the next update
                self.log.error("run.failed", error=f"{type(exc).__name__}: {exc}", trigger="resume")
            async for item in self._receive:
                try:
                    await self._feed_one(session, item.wake)
                except Exception as exc:
                    item.error = exc
                finally:
                    item.done.set()

    async def feed(self, wake: Wake) -> None:
        """Queue one update and wait until the session has handled it (the router's wake for it)."""
        item = _Item(wake)
        self._send.send_nowait(item)
        await item.done.wait()
        if item.error is not None:
            raise item.error

    def close(self) -> None:
        self._send.close()

    async def _feed_one(self, session: WarmSession, wake: Wake) -> None:
        contents, server = await read_current(self.pool, wake.uri, wake.server)
        self.fed += 1
        metrics.woke(wake.updates)
        self.log.info("reactive.wake", uri=wake.uri, server=server, seq=wake.seq, updates=wake.updates,
                      route="continue", turn=self.fed)
        # A resource may hold a credential a server echoed: registered secret values never reach the model.
        message = self.log.redactor.scrub(continue_message(wake.uri, server, contents))
        await session.send(message, uri=wake.uri)
