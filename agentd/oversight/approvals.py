"""People in the loop: the queue of what waits for a person, :class:`Approvals`.

Two things wait here: a tool call marked ``approve`` (``--approve SERVER__TOOL``, ``mcp_servers[].approve``) that
the loop holds before sending it, and a server's ``elicitation/create`` (a question for the user) where the
host opted in. Each is a :class:`Pending` item with a short id; ``agentd ctl approvals`` lists them, ``approve``,
``deny`` and ``answer`` decide them (agentd.ctl.commands), and the waiter wakes with a :class:`Decision`.

Why a leaf in a context variable (like agentd.oversight.operator): the loop asks, the control socket answers, and the two
meet only in the daemon that installs the queue (:func:`use_approvals`). A subagent's process installs one that
forwards every item up the tree to the root's (agentd.supervisor.asks). A process without one (a once run with no
state directory and no control socket, a library caller) has nobody to ask: the loop denies an approval at once
and an elicitation is declined at once, so nothing hangs and nothing unapproved is sent.

Why no process: a waiting item is a few hundred bytes here plus the run's own task, which was already in this
process (daemon runs are trio tasks, not children). What makes it durable is the run's journal (the loop commits
``approval.pending`` before it waits): after a crash the resumed run asks again (a new id), and the call was
never sent.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Final, Literal

import attrs
import trio

from agentd.oversight.drain import DrainLatch

#: What waits: a tool call to approve, or a server's question (elicitation) to answer.
Kind = Literal["approval", "elicitation"]
#: How a decision went: ``approve``/``deny`` an approval; ``accept`` (with content), ``decline`` or ``cancel`` an
#: elicitation (the MCP result's ``action``).
Action = Literal["approve", "deny", "accept", "decline", "cancel"]

#: The longest reason kept from ``agentd ctl deny ID REASON``.
MAX_REASON: Final = 500


@attrs.frozen
class Decision:
    """A person's answer: ``action``, the reason given (deny), the content (an accepted elicitation)."""

    action: Action
    reason: str | None = None
    content: Mapping[str, Any] | None = None

    @property
    def approved(self) -> bool:
        return self.action in ("approve", "accept")


class Pending:
    """One item that waits for a person. (A plain class with slots: a daemon may hold a thousand.)"""

    __slots__ = ("_done", "created", "decision", "id", "kind", "message", "path", "run_id", "schema", "server",
                 "summary", "tool")

    def __init__(self, id: str, kind: Kind, run_id: str, server: str, *, tool: str | None = None,
                 summary: Mapping[str, Any] | None = None, message: str | None = None,
                 schema: Mapping[str, Any] | None = None, path: str | None = None) -> None:
        self.id = id
        #: The served handle of the subagent that asks (its ``agent_path``), None for this process's own runs:
        #: whose it is on ``/events`` and in the served ``approval.pending`` event (agentd.transport.tenancy).
        self.path = path
        self.kind = kind
        self.run_id = run_id
        self.server = server
        self.tool = tool
        self.summary = summary
        self.message = message
        self.schema = schema
        self.created = time.time()
        self.decision: Decision | None = None
        self._done = trio.Event()

    def to_json(self) -> dict[str, Any]:
        """What ``agentd ctl approvals`` shows of it."""
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "run_id": self.run_id, "server": self.server}
        if self.kind == "approval":
            out["tool"] = f"{self.server}__{self.tool}"
            out["arguments"] = dict(self.summary or {})
        else:
            out["message"] = self.message
            out["schema"] = dict(self.schema or {})
        out["waiting_s"] = round(max(0.0, time.time() - self.created), 3)
        return out

    def waiting_line(self) -> dict[str, Any]:
        """The ``approval.waiting`` line the live view (``/events``, ``/ui/``) shows while it waits: what
        ``agentd ctl approvals`` shows of it, with the asking subagent's ``agent_path``."""
        return {"event": "approval.waiting", **self.to_json(), **({"agent_path": self.path} if self.path else {})}

    def settled_line(self) -> dict[str, Any]:
        """The ``approval.settled`` line once it waits no more: the ``action`` decided, or ``withdrawn`` (its run
        ended or was drained first)."""
        return {"event": "approval.settled", "id": self.id, "kind": self.kind, "run_id": self.run_id,
                "action": self.decision.action if self.decision is not None else "withdrawn",
                **({"agent_path": self.path} if self.path else {})}


#: Sends an item up to where a person can answer it (a subagent's parent, agentd.supervisor.asks): the decision.
Forward = Callable[[Pending], Awaitable[Decision]]
#: Told of each item as it starts waiting (``True``) and once it waits no more (``False``, its ``decision`` set
#: when one was made): the live view and the served events (agentd.daemon, agentd.selfmcp.surface). Must not
#: block or raise.
Watch = Callable[[Pending, bool], None]


class Approvals:
    """The queue (see the module docstring). Ids are short and count up per process: ``1``, ``2``, …

    ``forward`` (a subagent's queue): every item is sent up the tree instead of waiting here, so the question
    reaches the person at the root. ``watchers`` are told of each item as it comes and goes (:data:`Watch`)."""

    __slots__ = ("_count", "_pending", "forward", "watchers")

    def __init__(self, forward: Forward | None = None) -> None:
        self._pending: dict[str, Pending] = {}
        self._count = 0
        self.forward = forward
        self.watchers: list[Watch] = []

    def _add(self, item: Pending) -> Pending:
        self._pending[item.id] = item
        for watch in self.watchers:
            watch(item, True)
        return item

    def _remove(self, item_id: str) -> Pending | None:
        item = self._pending.pop(item_id, None)
        if item is not None:
            for watch in self.watchers:
                watch(item, False)
        return item

    def _next_id(self) -> str:
        self._count += 1
        return str(self._count)

    def approval(self, run_id: str, server: str, tool: str, summary: Mapping[str, Any], *,
                 path: str | None = None) -> Pending:
        """Queue a tool call for approval (``summary``: its arguments as a person may see them; ``path``: the
        asking subagent's handle)."""
        return self._add(Pending(self._next_id(), "approval", run_id, server, tool=tool, summary=summary, path=path))

    def elicitation(self, run_id: str, server: str, message: str, schema: Mapping[str, Any], *,
                    path: str | None = None) -> Pending:
        """Queue a server's question (its ``message`` and ``requestedSchema``)."""
        return self._add(Pending(self._next_id(), "elicitation", run_id, server, message=message, schema=schema,
                                 path=path))

    def pending(self) -> list[Pending]:
        """What waits now, oldest first."""
        return list(self._pending.values())

    def get(self, item_id: str) -> Pending | None:
        return self._pending.get(item_id)

    def decide(self, item_id: str, decision: Decision) -> Pending | None:
        """Settle ``item_id`` with ``decision`` (the caller checked it fits the item's kind); None: no such item
        waits (never queued, already decided, or its run ended)."""
        item = self._pending.get(item_id)
        if item is None:
            return None
        item.decision = decision
        self._remove(item_id)
        item._done.set()
        return item

    async def wait(self, item: Pending, drain: DrainLatch | None = None) -> Decision | None:
        """Wait for ``item``'s decision; None when ``drain`` was requested first (the process is stopping: the
        journal keeps the question, and the restarted run asks again). Unbounded by itself: the run's deadline
        (or a cancel) bounds it; the item leaves the queue however the wait ends."""
        try:
            if self.forward is not None:  # a subagent: the parent asks (and its drain ends it)
                item.decision = await self.forward(item)
            elif drain is None:
                await item._done.wait()
            elif not drain.requested:
                async with trio.open_nursery() as nursery:
                    async def first(wait: Callable[[], Awaitable[None]]) -> None:
                        await wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(first, item._done.wait)
                    nursery.start_soon(first, drain.wait)
        finally:
            self._remove(item.id)
        return item.decision


class Refused(Exception):
    """A server's request agentd answers with a JSON-RPC error instead of a result (``code``, ``message``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: Answers a server's request (elicitation, sampling) that arrives during a tool call: ``(server, method,
#: params)`` to the result, or :class:`Refused`. The loop installs one around each call to an opted-in server
#: (:func:`answering`); the MCP client looks it up where the request arrives (:func:`current_answerer`).
Answerer = Callable[[str, str, Mapping[str, Any]], Awaitable[dict[str, Any]]]

_ANSWERER: ContextVar[Answerer | None] = ContextVar("agentd_answerer", default=None)


def current_answerer() -> Answerer | None:
    """What answers a server's request for the tool call in flight, or None (then agentd declines an
    elicitation and refuses sampling: there is no run to ask for)."""
    return _ANSWERER.get()


@contextlib.contextmanager
def answering(answerer: Answerer) -> Iterator[None]:
    token = _ANSWERER.set(answerer)
    try:
        yield
    finally:
        _ANSWERER.reset(token)


_CURRENT: ContextVar[Approvals | None] = ContextVar("agentd_approvals", default=None)


def current_approvals() -> Approvals | None:
    """The daemon's queue, or None: nobody can be asked in this process."""
    return _CURRENT.get()


@contextlib.contextmanager
def use_approvals(approvals: Approvals) -> Iterator[Approvals]:
    token = _CURRENT.set(approvals)
    try:
        yield approvals
    finally:
        _CURRENT.reset(token)


__all__ = [
    "MAX_REASON",
    "Action",
    "Answerer",
    "Approvals",
    "Decision",
    "Forward",
    "Kind",
    "Pending",
    "Refused",
    "Watch",
    "answering",
    "current_answerer",
    "current_approvals",
    "use_approvals",
]
