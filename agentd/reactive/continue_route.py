"""``--continue <uri>``: route a URI's updates into one warm session, in order, instead of fresh runs.

Spawn versus continue: an update of a ``--continue`` URI is owned by the route, never by a fresh wake
(exactly one owner per update). The router still coalesces per URI (one running, one pending), and
the route feeds its session one message at a time in arrival order, each built from a fresh
``resources/read`` made just before the message is sent (notify-then-read, as for wakes).

The session is anything with ``send(message)``; :class:`ConversationSession` is the in-process one:
each message is a turn of an ordinary daemon run seeded with the earlier turns (capped), so the agent
remembers what it did for earlier updates.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Protocol

import attrs
import trio

from agentd.events import EventLog
from agentd.reactive.router import Wake
from agentd.reactive.runs import DaemonRuns, Job
from agentd.reactive.wake_prompt import continue_message
from agentd.reactive.watch import ResourcePool, read_current
from agentd.telemetry import metrics

#: Earlier turns a conversation keeps as its seed (user + assistant message each).
MAX_SEED_TURNS: Final = 20


class WarmSession(Protocol):
    async def send(self, message: str, *, uri: str | None = None) -> Any: ...


OpenSession = Callable[[str], AbstractAsyncContextManager[WarmSession]]


@attrs.define(eq=False)
class ConversationSession:
    """A warm session inside this process: each ``send`` is one run continuing the conversation."""

    runs: DaemonRuns
    instruction: str
    turns: list[Mapping[str, Any]] = attrs.field(factory=list)

    async def send(self, message: str, *, uri: str | None = None) -> Any:
        text = message if self.turns else f"{self.instruction}\n\n---\n{message}"
        result = await self.runs.run(Job("continue", text, uri, seed=tuple(self.turns)))
        if result is not None:
            answer = result.result if isinstance(result.result, str) else repr(result.result)
            self.turns += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
            del self.turns[: max(0, len(self.turns) - 2 * MAX_SEED_TURNS)]
        return result


def conversation_sessions(runs: DaemonRuns) -> OpenSession:
    @contextlib.asynccontextmanager
    async def open_session(instruction: str) -> AsyncIterator[WarmSession]:
        yield ConversationSession(runs, instruction)

    return open_session


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
