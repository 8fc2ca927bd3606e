"""What a turn runner gets from its session: the run payload, the channel to report on, its nested supervisor,
and the conversation so far (a warm session's earlier turns). Its own module so the turn runners and the
session each import it, and never each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from agentd.supervisor.channel import ControlChannel
from agentd.supervisor.messages import Progress, Result, RunPayload, Usage


@attrs.define(eq=False)
class ChildContext:
    """What a turn runner gets: the payload, reporting, and the nested supervisor for its own spawns."""

    payload: RunPayload
    channel: ControlChannel
    supervisor: Any = None  # agentd.supervisor.supervisor.Supervisor, typed loosely to keep imports lazy
    history: list[dict[str, Any]] = attrs.field(factory=list)
    #: Why the session was cancelled (set by the session as it cancels the turn), or None.
    cancelled: str | None = None
    #: The session's credential source for OAuth / client-credentials connections (agentd.child.turn), or None.
    credentials: Any = None

    async def usage(self, prompt_tokens: int, completion_tokens: int, estimated_tokens: int = 0,
                    cost: int | None = None) -> None:
        await self.channel.send(Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                      estimated_tokens=estimated_tokens, cost=cost))

    async def progress(self, note: str = "") -> None:
        await self.channel.send(Progress(note=note))


#: Cancellations after which a journaled child's run stays unfinished, to be resumed: the tree is stopping
#: (the parent died, drained or ended with the child running, a kill-ladder rung), not ending this work.
#: Any other reason (a ``subagent.cancel``, the token ceiling) is the run's end: it is journaled ``cancelled``.
KEEPS_RUN_OPEN = frozenset({"the parent is gone", "the parent closed the channel", "terminated", "parent ended",
                            "draining"})

#: A turn: given the context and this turn's message, return the turn's Result.
TurnRunner = Callable[[ChildContext, str], Awaitable[Result]]
