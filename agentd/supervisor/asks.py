"""A subagent's questions for a person travel up the tree to the root's queue (agentd.oversight.approvals).

A subagent's process has no control socket: nobody can answer there. So its queue forwards (:class:`RemoteAsker`,
installed by agentd.child.session): each item becomes an ``ask`` frame to the parent, which puts it in its own
queue (:func:`answer_ask`); in a middle child that queue forwards again, and at the root it waits for
``agentd ctl approve`` / ``deny`` / ``answer`` like the root's own. The ``answered`` frame comes back down the same
way, correlated by ``ref`` like ``admit``. A root with nobody to ask (no control socket) answers at once with a
denial (a decline for a question); a parent that goes away answers the same, so a child never waits on a dead
channel.
"""

from __future__ import annotations

import itertools
from typing import Final

import trio

from agentd.oversight.approvals import Action, Decision, Pending, current_approvals
from agentd.oversight.drain import current_drain
from agentd.supervisor.channel import ControlChannel
from agentd.supervisor.messages import Answered, Ask

#: The actions an ``answered`` frame may carry.
_ACTIONS: Final[frozenset[str]] = frozenset({"approve", "deny", "accept", "decline", "cancel"})
#: Why a question is refused without asking anyone.
NOBODY: Final = ("nobody can be asked: the root agentd has no control socket (run it with --state-dir or "
                 "--ctl-socket and approve with agentd ctl approve)")


def _refusal(kind: str) -> Action:
    return "deny" if kind == "approval" else "decline"


class RemoteAsker:
    """A child's side: sends each item up as ``ask`` and waits for its ``answered`` (see the module docstring)."""

    __slots__ = ("_pending", "_refs", "channel")

    def __init__(self, channel: ControlChannel) -> None:
        self.channel = channel
        self._refs = itertools.count(1)
        self._pending: dict[int, trio.MemorySendChannel[Answered]] = {}

    async def forward(self, item: Pending) -> Decision:
        ref = next(self._refs)
        send, receive = trio.open_memory_channel[Answered](1)
        self._pending[ref] = send
        try:
            await self.channel.send(Ask(ref=ref, kind=item.kind, run_id=item.run_id, server=item.server,
                                        tool=item.tool, summary=dict(item.summary) if item.summary else None,
                                        message=item.message, schema=dict(item.schema) if item.schema else None))
            answer = await receive.receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return Decision(_refusal(item.kind), "the parent agentd is gone")
        finally:
            del self._pending[ref]
        action = answer.action if answer.action in _ACTIONS else _refusal(item.kind)
        return Decision(action, answer.reason, answer.content)  # type: ignore[arg-type]

    def deliver(self, answer: Answered) -> None:
        """Called by the child's control reader when the parent answers an ``ask``."""
        send = self._pending.get(answer.ref)
        if send is not None:
            send.send_nowait(answer)


async def answer_ask(request: Ask, path: str | None = None) -> Answered:
    """A parent's side: the child's question in this process's queue (the root's, or forwarded further up);
    ``path``: the handle of the child it came from (whose it is on ``/events`` and in the served events)."""
    refusal = _refusal(request.kind)
    queue = current_approvals()
    if queue is None or request.kind not in ("approval", "elicitation"):
        return Answered(ref=request.ref, action=refusal, reason=NOBODY)
    if request.kind == "approval":
        item = queue.approval(request.run_id, request.server, request.tool or "?", request.summary or {},
                              path=path)
    else:
        item = queue.elicitation(request.run_id, request.server, request.message or "", request.schema or {},
                                 path=path)
    decision = await queue.wait(item, current_drain())
    if decision is None:  # the root is stopping: the child's tree is ending with it
        return Answered(ref=request.ref, action=refusal if request.kind == "approval" else "cancel",
                        reason="agentd is stopping")
    return Answered(ref=request.ref, action=decision.action, reason=decision.reason,
                    content=dict(decision.content) if decision.content is not None else None)


__all__ = ["NOBODY", "RemoteAsker", "answer_ask"]
