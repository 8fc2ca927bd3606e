"""Where spawn admission and tree accounting happen: locally at the root, or by asking up the channel.

The root process owns the one :class:`~agentd.supervisor.caps.TreeLedger`. A nested child's supervisor
holds a :class:`RemoteAuthority` that forwards ``admit``/``release``/``usage``/``metrics`` to its parent, whose node
forwards them on, until they reach the root. So caps, depth minting and scope narrowing are decided in
exactly one place however deep the tree is, and usage of every descendant reaches the token ceiling.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

import trio

from agentd.journal.errors import JournalError
from agentd.supervisor.caps import Admission, Refusal, TreeLedger
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog, null_log

if TYPE_CHECKING:  # the wire messages load with a child's channel: a root that spawns nothing never needs them
    from agentd.journal.store import JournalStore
    from agentd.supervisor.messages import Admit, Admitted, MetricsDelta, Release, Usage


class Tokens(Protocol):
    """What a usage report carries: a child's ``usage`` frame, or the root's own reply usage as it is."""

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def total(self) -> int: ...

    @property
    def cost(self) -> int | None:
        """What they cost in picodollars (agentd.prices); None: not priced."""
        ...


class Authority(Protocol):
    """``tree`` names the root's run tree a root-level spawn or the root's own usage belongs to (the
    token ceiling is per run tree; see agentd.supervisor.caps). Only the root's authority uses it. ``handle``
    re-admits a resumed run's child under the handle an earlier process gave it (TreeLedger.admit)."""

    async def admit(
        self, caller: str, tool_scope: Iterable[str] | None, *, served: bool = False, tree: str = "",
        budget: int | None = None, handle: str | None = None,
    ) -> Admission | Refusal: ...

    async def release(self, handle: str) -> None: ...

    async def report_usage(self, handle: str, usage: Tokens, *, tree: str = "",
                           cost: int | None = None) -> bool | str:
        """Count ``usage`` for ``handle``; true when the root's own run (``handle`` is the root) must make no
        further model call: past the ceiling, past its slice, or nothing left (``"budget_usd"``,
        agentd.agent.runner.BUDGET_USD, when it is the money budget that is spent). A subagent past its slice
        is cancelled by the root instead (its report answers False below the root). ``cost`` (picodollars), when
        given, is what ``usage`` cost where the usage itself does not say it (the root's own reply, as the
        gateway reported it, priced by the run's meter: no second usage value per step)."""
        ...

    async def report_metrics(self, delta: MetricsDelta) -> None: ...


class LocalAuthority:
    """The root's authority. ``on_ceiling(handle)`` is told which subtree pushed the tree past its ceiling
    (or its child past its slice); ``on_change()`` is called after every admission, release and usage report.

    With ``store`` (``--state-dir``) each run tree's reservation books are saved after every change and
    read back the first time a tree is used, so a restarted process resumes the same books (the subagents
    of the earlier process did not survive: their slices are closed). ``run_id`` names the once run's tree
    (``tree=""``) in the store; a served tree is saved under its ``served.N`` (namespace
    ``budget.served``), read back when a re-opened session continues it, and forgotten when its root ends
    (but not in a drain: a warm session the drain ended may come back after the restart). (A plain class,
    like the other holders a once run builds at start-up.)
    """

    __slots__ = ("_loaded", "ledger", "log", "on_ceiling", "on_change", "run_id", "store")

    def __init__(self, ledger: TreeLedger, on_ceiling: Callable[[str], None] = lambda handle: None,
                 on_change: Callable[[], None] = lambda: None, store: JournalStore | None = None,
                 run_id: str = "", log: EventLog | None = None) -> None:
        self.ledger = ledger
        self.on_ceiling = on_ceiling
        self.on_change = on_change
        self.store = store
        self.run_id = run_id
        self.log = null_log() if log is None else log
        self._loaded: set[str] = set()

    async def admit(
        self, caller: str, tool_scope: Iterable[str] | None, *, served: bool = False, tree: str = "",
        budget: int | None = None, handle: str | None = None,
    ) -> Admission | Refusal:
        if not served:
            await self._load(self.ledger.tree_key(caller, tree))
        elif tree:  # a re-opened served session continues its earlier tree
            await self._load(tree)
        decision = self.ledger.admit(caller, tool_scope, trio.current_time(), served=served, tree=tree,
                                     budget=budget, handle=handle)
        if isinstance(decision, Refusal):
            metrics.spawn_refused(decision.cap)
        else:
            metrics.subagents_live(self.ledger.live)
            key = self.ledger.tree_key(decision.handle)
            self._loaded.add(key)  # a new served tree has nothing saved to read back
            await self._save(key)
        self.on_change()
        return decision

    async def release(self, handle: str) -> None:
        key = self.ledger.tree_key(handle)
        over = self.ledger.release(handle)
        metrics.subagents_live(self.ledger.live)
        if over is not None:  # a served tree's run is over: nothing continues it
            self._loaded.discard(over)
            await self._drop(over)
        else:
            await self._save(key)
        self.on_change()

    async def report_usage(self, handle: str, usage: Tokens, *, tree: str = "",
                           cost: int | None = None) -> bool | str:
        key = self.ledger.tree_key(handle, tree)
        await self._load(key)
        over, stop = self.ledger.charge_reply(usage.total, usage.cost if cost is None else cost, handle, tree)  # tokens and money, one pass
        await self._save(key)
        own = handle == self.ledger.root
        if over and not own:
            self.on_ceiling(handle)
        self.on_change()
        return stop if own else False

    async def report_metrics(self, delta: MetricsDelta) -> None:
        metrics.merge(delta.depth, delta.observations)

    # -- the saved books (--state-dir) ---------------------------------------------------------------------

    def _stored_as(self, tree: str) -> tuple[str, str] | None:
        """Where ``tree``'s books are saved: (namespace, key), or None (no store, or no name)."""
        if self.store is None:
            return None
        from agentd.journal.ledger import NAMESPACE as LEDGER_NAMESPACE
        from agentd.journal.ledger import SERVED_NAMESPACE

        if tree.startswith("served."):
            return SERVED_NAMESPACE, tree
        name = tree or self.run_id
        return (LEDGER_NAMESPACE, name) if name else None

    async def _load(self, tree: str) -> None:
        stored = self._stored_as(tree)
        if stored is None or tree in self._loaded:
            return
        self._loaded.add(tree)
        assert self.store is not None
        namespace, name = stored
        from agentd.journal.ledger import load_books

        try:
            books = await load_books(self.store, name, namespace=namespace)
        except JournalError as exc:  # unreadable books: start afresh rather than refuse every spawn
            self.log.warn("journal.write_failed", namespace=namespace, error=str(exc))
            return
        if books is not None:
            saved, money = books
            ended = self.ledger.adopt(tree, saved, money)
            extra = {} if money is None else {"spent_usd_pico": money.committed() + money.overdrawn()}
            self.log.info("budget.restored", tree=name, committed=saved.committed(),
                          ceiling=saved.ceiling, ended=ended, **extra)

    async def _save(self, tree: str) -> None:
        stored = self._stored_as(tree)
        book = self.ledger.existing_book(tree)
        if stored is None or book is None:
            return
        assert self.store is not None
        namespace, name = stored
        from agentd.journal.ledger import save_ledger

        try:
            await save_ledger(self.store, name, book, namespace=namespace, money=self.ledger.existing_money(tree))
        except JournalError as exc:
            self.log.warn("journal.write_failed", namespace=namespace, error=str(exc))

    async def _drop(self, tree: str) -> None:
        stored = self._stored_as(tree)
        if stored is None:
            return
        assert self.store is not None
        namespace, name = stored
        from agentd.journal.ledger import drop_ledger

        try:
            await drop_ledger(self.store, name, namespace=namespace)
        except JournalError as exc:
            self.log.warn("journal.write_failed", namespace=namespace, error=str(exc))


class _Sender(Protocol):
    async def send(self, message: Admit | Release | Usage | MetricsDelta) -> None: ...


class RemoteAuthority:
    """A nested child's authority: every decision is made by the root, reached through ``channel``."""

    __slots__ = ("_pending", "_refs", "channel")

    def __init__(self, channel: _Sender) -> None:
        self.channel = channel
        self._refs = itertools.count(1)
        self._pending: dict[int, trio.MemorySendChannel[Admitted]] = {}

    async def admit(
        self, caller: str, tool_scope: Iterable[str] | None, *, served: bool = False, tree: str = "",
        budget: int | None = None, handle: str | None = None,
    ) -> Admission | Refusal:
        from agentd.supervisor.messages import Admit, Admitted

        ref = next(self._refs)
        send, receive = trio.open_memory_channel[Admitted](1)
        self._pending[ref] = send
        try:
            scope = None if tool_scope is None else list(tool_scope)
            await self.channel.send(Admit(ref=ref, caller=caller, tool_scope=scope, budget=budget, handle=handle))
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
        from agentd.supervisor.messages import Release

        try:
            await self.channel.send(Release(handle=handle))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def report_usage(self, handle: str, usage: Tokens, *, tree: str = "",
                           cost: int | None = None) -> bool | str:
        from agentd.supervisor.messages import Usage

        try:
            await self.channel.send(usage if isinstance(usage, Usage) and cost is None else Usage(
                usage.prompt_tokens, usage.completion_tokens, cost=usage.cost if cost is None else cost))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        return False  # the root decides, and cancels a subtree past its slice

    async def report_metrics(self, delta: MetricsDelta) -> None:
        try:
            await self.channel.send(delta)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
