"""Where spawn admission and tree accounting happen: locally at the root, or by asking up the channel.

The root process owns the one :class:`~agentd.supervisor.caps.TreeLedger`. A nested child's supervisor
holds a :class:`RemoteAuthority` that forwards ``admit``/``release``/``usage``/``metrics`` to its parent, whose node
forwards them on, until they reach the root. So caps, depth minting and scope narrowing are decided in
exactly one place however deep the tree is, and usage of every descendant reaches the token ceiling.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs
import trio

from agentd.supervisor.caps import Admission, Refusal, TreeLedger
from agentd.supervisor.messages import Admit, Admitted, MetricsDelta, Release, Usage
from agentd.telemetry import metrics


class Authority(Protocol):
    """``tree`` names the root's run tree a root-level spawn or the root's own usage belongs to (the
    token ceiling is per run tree; see agentd.supervisor.caps). Only the root's authority uses it."""

    async def admit(
        self, caller: str, tool_scope: Iterable[str] | None, *, served: bool = False, tree: str = ""
    ) -> Admission | Refusal: ...

    async def release(self, handle: str) -> None: ...

    async def report_usage(self, handle: str, usage: Usage, *, tree: str = "") -> None: ...

    async def report_metrics(self, delta: MetricsDelta) -> None: ...


@attrs.define(eq=False)
class LocalAuthority:
    """The root's authority. ``on_ceiling(handle)`` is told which subtree pushed the tree past its ceiling;
    ``on_change()`` is called after every admission, release and usage report (the ledger changed)."""

    ledger: TreeLedger
    on_ceiling: Callable[[str], None] = lambda handle: None
    on_change: Callable[[], None] = lambda: None

    async def admit(
        self, caller: str, tool_scope: Iterable[str] | None, *, served: bool = False, tree: str = ""
    ) -> Admission | Refusal:
        decision = self.ledger.admit(caller, tool_scope, trio.current_time(), served=served, tree=tree)
        if isinstance(decision, Refusal):
            metrics.spawn_refused(decision.cap)
        else:
            metrics.subagents_live(self.ledger.live)
        self.on_change()
        return decision

    async def release(self, handle: str) -> None:
        self.ledger.release(handle)
        metrics.subagents_live(self.ledger.live)
        self.on_change()

    async def report_usage(self, handle: str, usage: Usage, *, tree: str = "") -> None:
        if self.ledger.add_tokens(usage.total, handle, tree):
            self.on_ceiling(handle)
        self.on_change()

    async def report_metrics(self, delta: MetricsDelta) -> None:
        metrics.merge(delta.depth, delta.observations)


class _Sender(Protocol):
    async def send(self, message: Admit | Release | Usage | MetricsDelta) -> None: ...


@attrs.define(eq=False)
class RemoteAuthority:
    """A nested child's authority: every decision is made by the root, reached through ``channel``."""

    channel: _Sender
    _refs: itertools.count[int] = attrs.field(init=False, factory=lambda: itertools.count(1))
    _pending: dict[int, trio.MemorySendChannel[Admitted]] = attrs.field(init=False, factory=dict)

    async def admit(
        self, caller: str, tool_scope: Iterable[str] | None, *, served: bool = False, tree: str = ""
    ) -> Admission | Refusal:
        ref = next(self._refs)
        send, receive = trio.open_memory_channel[Admitted](1)
        self._pending[ref] = send
        try:
            scope = None if tool_scope is None else list(tool_scope)
            await self.channel.send(Admit(ref=ref, caller=caller, tool_scope=scope))
            answer = await receive.receive()
        finally:
            del self._pending[ref]
        if answer.handle is not None and answer.depth is not None:
            return Admission(answer.handle, answer.depth, frozenset(answer.scope or ()))
        return Refusal(answer.refusal or "spawn refused", retryable=answer.retryable)

    def deliver(self, answer: Admitted) -> None:
        """Called by the child's control reader when the parent answers an ``admit``."""
        send = self._pending.get(answer.ref)
        if send is not None:
            send.send_nowait(answer)

    async def release(self, handle: str) -> None:
        try:
            await self.channel.send(Release(handle=handle))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def report_usage(self, handle: str, usage: Usage, *, tree: str = "") -> None:
        try:
            await self.channel.send(usage)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def report_metrics(self, delta: MetricsDelta) -> None:
        try:
            await self.channel.send(delta)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
