"""The Supervisor: the one spawn chokepoint, and the handles of the subagents it runs.

``spawn(caller, request)`` is the only way a subagent comes to exist: the in-loop ``subagent.*`` tools,
``graph.run`` and the served self-MCP tools all call it. It asks the authority (the root's ledger, or the
root through the channel for a nested child) for an admission, builds the run payload (servers narrowed to
the admitted scope, only the secrets those servers name), and runs a :class:`SubagentNode`:

- sync: the node runs inside the caller's own task, so the caller's cancellation (deadline, step budget,
  its own cancellation) cancels the child through the node's scope;
- async and warm: the node runs in the supervisor's nursery, which the owning run outlives; closing the
  supervisor cancels whatever is still running, down the kill ladder.
"""

from __future__ import annotations

import enum
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from agentd import defaults, telemetry
from agentd.agent.result import RunUsage
from agentd.security.secrets import referenced_env_names
from agentd.supervisor.authority import Authority, LocalAuthority
from agentd.supervisor.caps import TREES_KEPT, Admission, Caps, Refusal, TreeLedger, is_within
from agentd.supervisor.ladder import Graces
from agentd.supervisor.liveness import LivenessSettings
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog, null_log
from agentd.telemetry.names import TRACEPARENT, TRACESTATE

if TYPE_CHECKING:
    # Imported where used: a run that spawns nothing (a once run's start-up) loads no node, fork server,
    # wire message or statistics module (tests/cli/test_startup_imports.py).
    from agentd.journal.store import JournalStore
    from agentd.supervisor.forkserver import ForkServer
    from agentd.supervisor.idlepings import IdlePings
    from agentd.supervisor.messages import RunPayload
    from agentd.supervisor.node import NodeSettings, RunView, SubagentNode
    from agentd.supervisor.statistics import NodeStatistics, SupervisorStatistics

#: Ended subagents whose final view stays readable by handle (oldest forgotten first).
ENDED_KEPT = 1024


def referenced_secrets(config: Any, available: Mapping[str, str]) -> dict[str, str]:
    """The entries of ``available`` that some string in ``config`` (nested dicts and lists) references.

    Which names a string references is :func:`agentd.security.secrets.referenced_env_names`'s decision alone, so a
    child receives exactly the secrets a parent would resolve for the same templates.
    """
    names: set[str] = set()
    stack: list[Any] = [config]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            names |= referenced_env_names(value)
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    return {name: available[name] for name in sorted(names) if name in available}


class Origin(enum.Enum):
    STDIO = "stdio"  # the agent's own loop (and the supervisor↔child control path)
    MANAGEMENT = "management"  # an authenticated peer of the served self-MCP


@attrs.frozen
class Caller:
    origin: Origin
    handle: str = "0"
    #: The root's run tree this caller's spawns count in (a daemon's wake passes its run id, so the
    #: token ceiling is per wake); "" is the once-mode run. Ignored below the root. A MANAGEMENT spawn opens
    #: its own tree unless this names a served tree to continue (a re-opened warm session's ``served.N``).
    tree: str = ""
    #: Reach only the children spawned in ``tree`` (a cluster work item's run, which may be any tenant's: the
    #: runs of one member share its handles). False: every child under ``handle`` (a daemon's wakes share them).
    own_tree_only: bool = False


@attrs.frozen
class SpawnRequest:
    instruction: str
    output_contract: str | None = None
    tool_scope: tuple[str, ...] | None = None
    async_: bool = False
    warm: bool = False
    #: Extra context handed to the child (graph runs pass their dependencies' results here).
    context: tuple[Any, ...] = ()
    #: The child's token slice of its tree's ceiling (None: the default share; agentd.supervisor.caps).
    token_budget: int | None = None
    #: Earlier turns (chat messages) a warm session re-opened after a restart continues from.
    history: tuple[Any, ...] = ()
    #: Told the minted handle once the spawn is admitted, before the child starts: the served side records
    #: who owns it before any line of it is logged (agentd.transport.tenancy).
    on_admitted: Callable[[str], None] | None = attrs.field(default=None, eq=False, repr=False)
    #: The run id the child journals its own run under (docs/durability.md), derived by the spawner from its
    #: own run so that a spawn made again after a crash names the same run and resumes it; None: the child
    #: is not journaled (no journal, a warm session).
    journal_run: str | None = None
    #: The spawner's run started in its own process (agentd.journal.recorder.RunRecorder.new): no earlier process
    #: journaled ``journal_run``, so the child neither looks for it nor commits its start alone.
    journal_new: bool = False
    #: The spawner is a journaled run of the same store that takes the child's result as a tool call's outcome
    #: (``subagent.*``, ``graph.run``): it commits the child's end before anything acts on it outside agentd, so
    #: the child commits its ``run.ended`` without a flush (docs/durability.md, "fsync policy"). False (a served
    #: spawn, whose result is handed to a client): flushed.
    journal_parent: bool = False
    #: The model the child calls (``--models`` is the allow-list: :meth:`Supervisor.model_refusal`); None: the
    #: spawner's own.
    model: str | None = None
    #: Resume a child an earlier process of the caller's run spawned under this handle (the model holds it):
    #: admitted under it again (agentd.supervisor.caps.TreeLedger.admit); None: a new handle.
    handle: str | None = None


@attrs.frozen
class SupervisorSettings:
    caps: Caps = attrs.field(factory=Caps)
    graces: Graces = attrs.field(factory=Graces)
    liveness: LivenessSettings = attrs.field(factory=LivenessSettings)
    await_timeout: float = defaults.AWAIT_TIMEOUT
    drain_timeout: float = defaults.DRAIN_TIMEOUT
    node: NodeSettings | None = None

    def node_settings(self) -> NodeSettings:
        from agentd.supervisor.node import NodeSettings

        base = self.node or NodeSettings()
        return attrs.evolve(base, graces=self.graces, liveness=self.liveness)

    def to_payload(self) -> dict[str, Any]:
        """What a nested child's own supervisor needs (graces and liveness; caps stay at the root)."""
        return {"graces": attrs.asdict(self.graces), "liveness": attrs.asdict(self.liveness),
                "await_timeout": self.await_timeout, "drain_timeout": self.drain_timeout}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any], caps: Caps | None = None) -> SupervisorSettings:
        return cls(caps=caps or Caps(), graces=Graces(**data.get("graces", {})),
                   liveness=LivenessSettings(**data.get("liveness", {})),
                   await_timeout=float(data.get("await_timeout", defaults.AWAIT_TIMEOUT)),
                   drain_timeout=float(data.get("drain_timeout", defaults.DRAIN_TIMEOUT)))


#: Test-only hook: maps a request to a scripted child behaviour (see agentd.child.scripted). It exists
#: only as a Python argument of :class:`Supervisor`, so no MCP peer, model or argv can reach it.
TestScript = Callable[[SpawnRequest, str], "dict[str, Any] | None"]


class Supervisor:
    """The subagent chokepoint of one agent process. (A plain class, like the other mutable holders a once run
    builds at start-up.)"""

    __slots__ = ("_changed", "_ended", "_fork_lock", "_fork_server", "_idle_pings", "_nodes", "_own_spent",
                 "_per_spawn", "_spent", "_state_changed", "authority", "child_config", "draining", "fork_connection",
                 "handle", "journal_at", "journal_dir", "journal_trees", "lame_duck", "log", "nursery", "secrets",
                 "settings", "telemetry", "test_script", "use_fork_server")

    def __init__(
        self, nursery: trio.Nursery, authority: Authority, handle: str = "0",
        settings: SupervisorSettings | None = None, child_config: Mapping[str, Any] | None = None,
        secrets: Mapping[str, str] | None = None, telemetry: Mapping[str, Any] | None = None,
        log: EventLog | None = None, test_script: TestScript | None = None, draining: bool = False,
        lame_duck: bool = False, use_fork_server: bool = False, fork_connection: int | None = None,
        journal_dir: str | None = None, journal_at: Mapping[str, Any] | None = None,
    ) -> None:
        self.nursery = nursery
        #: The tree's state directory (``--state-dir``): a child whose request names a ``journal_run`` journals
        #: its own steps there. None: children are not journaled.
        self.journal_dir = journal_dir
        #: Where children journal when it is not a state directory: a cluster member's run tree's fenced journal
        #: (``{"cluster": ...}``, agentd.cluster.store.open_fenced_journal), as this process's own parent said.
        self.journal_at = journal_at
        #: Per run tree of the agent's own runs (``Caller.tree``), where its children journal: a cluster work
        #: item's run, fenced by the item's lease (agentd.daemon sets it while the item runs).
        self.journal_trees: dict[str, Mapping[str, Any]] = {}
        self.authority = authority
        self.handle = handle
        self.settings = SupervisorSettings() if settings is None else settings
        #: The run configuration children inherit (JSON-able), with ``mcp_servers`` as a list of dicts.
        self.child_config: Mapping[str, Any] = {} if child_config is None else child_config
        #: Secret values by name, available to forward to children whose servers reference them.
        self.secrets: Mapping[str, str] = {} if secrets is None else secrets
        self.telemetry: Mapping[str, Any] = {} if telemetry is None else telemetry
        self.log = null_log() if log is None else log
        self.test_script = test_script
        self.draining = draining
        #: The operator's lame duck (agentd.ctl): served spawns are refused; the agent's own runs go on.
        self.lame_duck = lame_duck
        self.use_fork_server = use_fork_server
        #: A forked child's own connection to the tree's fork server (a descriptor), used instead of starting
        #: a server; once it is gone this supervisor re-executes.
        self.fork_connection = fork_connection
        self._fork_server: ForkServer | None = None
        self._fork_lock = trio.Lock()
        self._nodes: dict[str, SubagentNode] = {}
        #: Handles of the ended subagents whose views are kept, in the order they ended (a dict as an ordered set).
        self._ended: dict[str, None] = {}
        #: One timer pinging every idle warm session (agentd.supervisor.idlepings), not a sleeping task each.
        #: Built with the first spawn (:meth:`_pings`).
        self._idle_pings: IdlePings | None = None
        #: What every spawn of this supervisor shares, built on the first (a spawn burst rebuilt them per
        #: child): the settings they were derived from, the node settings, the supervision payload, the env.
        self._per_spawn: tuple[SupervisorSettings, NodeSettings, dict[str, Any], dict[str, str]] | None = None
        #: Per run tree of the agent's own runs, what its ended subagents' subtrees used (newest trees last,
        #: at most TREES_KEPT): a run's result counts them (:meth:`settle_run`).
        self._spent: OrderedDict[str, RunUsage] = OrderedDict()
        #: What all the ended subagents of the agent's own runs used (every tree: a daemon mode's whole life).
        self._own_spent = RunUsage()
        self._changed = trio.Event()
        #: Replaced on every observable change (see :meth:`wait_until`).
        self._state_changed = trio.Event()

    # -- the chokepoint ---------------------------------------------------------------------------

    async def spawn(self, caller: Caller, request: SpawnRequest) -> RunView | Refusal:
        if self.draining:
            metrics.spawn_refused("draining")
            return self._refused(caller, Refusal("spawn refused: draining, no new subagents are accepted",
                                                 cap="draining"))
        if self.lame_duck and caller.origin is Origin.MANAGEMENT:
            metrics.spawn_refused("lame_duck")
            return self._refused(caller, Refusal("spawn refused: lame duck, no new served runs are accepted",
                                                 retryable=True, cap="lame_duck"))
        if request.model is not None:
            wrong = self.model_refusal(request.model)
            if wrong is not None:  # before any admission: nothing is reserved, no process starts
                metrics.spawn_refused("model")
                return self._refused(caller, wrong)
        admitted = await self.authority.admit(
            self.handle if caller.origin is Origin.MANAGEMENT else caller.handle,
            request.tool_scope, served=caller.origin is Origin.MANAGEMENT, tree=caller.tree,
            budget=request.token_budget, handle=request.handle,
        )
        if isinstance(admitted, Refusal):
            return self._refused(caller, admitted)
        if request.on_admitted is not None:
            request.on_admitted(admitted.handle)
        try:
            fork_server = await self._forks()
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await self.authority.release(admitted.handle)  # admitted, never started: free the slot
            raise
        from agentd.supervisor.node import SubagentNode

        _, node_settings, _, env = self._shared()
        node = SubagentNode(
            handle=admitted.handle, payload=self._payload(admitted, request, caller), authority=self.authority,
            log=self.log.bind(agent_path=admitted.handle, comp="supervisor"),
            settings=node_settings, fork_server=fork_server, on_change=self.notify_changed, env=env,
            idle_pings=self._pings(), tree=caller.tree if caller.origin is Origin.STDIO else None,
        )
        self._nodes[admitted.handle] = node
        self.notify_changed()
        if request.async_ or request.warm:
            await self.nursery.start(self._run_node, node)
        else:
            await self._run_node(node)
        if node.start_error is not None:
            # No process (out of descriptors or processes): a retryable refusal, not a run that never was.
            self._nodes.pop(admitted.handle, None)
            self._ended.pop(admitted.handle, None)
            self.notify_changed()
            return self._refused(caller, Refusal(f"spawn refused: {node.start_error}", retryable=True,
                                                 cap="resources"))
        if request.warm:
            return await node.wait_turn()
        return node.view()

    def model_refusal(self, model: str) -> Refusal | None:
        """Why a spawn may not choose ``model``: the allow-list is the spawner's ``models`` (``--models``)
        and its own model; with no ``--models``, only its own."""
        own = self.child_config.get("model")
        allowed = [own] if isinstance(own, str) else []
        allowed += [m for m in self.child_config.get("models") or () if isinstance(m, str) and m not in allowed]
        if model in allowed:
            return None
        return Refusal(f"spawn refused: model {model[:200]!r} is not allowed here (allowed: "
                       f"{', '.join(allowed) or 'none'}; --models)", cap="model")

    def _pings(self) -> IdlePings:
        if self._idle_pings is None:
            from agentd.supervisor.idlepings import IdlePings

            self._idle_pings = IdlePings(self.nursery)
        return self._idle_pings

    async def _forks(self) -> ForkServer | None:
        """The fork server, started on first use; None (re-exec) when disabled or it cannot start."""
        if not self.use_fork_server:
            return None
        from agentd.supervisor.forkserver import ForkServerGone, connect_fork_server, start_fork_server
        from agentd.supervisor.node import child_environment

        async with self._fork_lock:
            if self._fork_server is None or self._fork_server.gone:
                if self._fork_server is not None:
                    with trio.CancelScope(shield=True):
                        await self._fork_server.aclose()  # reap the dead one before starting anew
                    if self._fork_server.proc is None:  # the tree's server is gone: re-exec from now on
                        self.use_fork_server = False
                        return None
                try:
                    if self.fork_connection is not None:
                        fd, self.fork_connection = self.fork_connection, None
                        self._fork_server = await connect_fork_server(self.nursery, fd, log=self.log,
                                                                      on_gone=self.notify_changed)
                    else:
                        self._fork_server = await start_fork_server(
                            self.nursery, env=child_environment(os.environ), log=self.log,
                            python=self.settings.node_settings().python, on_gone=self.notify_changed,
                            journal=self.journal_dir is not None)
                except (ForkServerGone, OSError, trio.TooSlowError) as exc:
                    self.log.warn("subagent.failed", handle="forkserver", reason=f"fork server: {exc}")
                    self.use_fork_server = False
                    return None
                finally:
                    self.notify_changed()
            return self._fork_server

    def _shared(self) -> tuple[SupervisorSettings, NodeSettings, dict[str, Any], dict[str, str]]:
        if self._per_spawn is None or self._per_spawn[0] is not self.settings:
            from agentd.supervisor.node import child_environment

            self._per_spawn = (self.settings, self.settings.node_settings(), self.settings.to_payload(),
                               child_environment(os.environ))
        return self._per_spawn

    def _refused(self, caller: Caller, refusal: Refusal) -> Refusal:
        self.log.info("subagent.refused", caller=caller.handle, origin=caller.origin.value,
                      reason=refusal.message, cap=refusal.cap)
        return refusal

    async def _run_node(self, node: SubagentNode, *,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await node.run(task_status=task_status)
        finally:
            if node.tree is not None and node.usage.total_tokens:
                self._own_spent += node.usage
                self._spent[node.tree] = self._spent.pop(node.tree, RunUsage()) + node.usage
                while len(self._spent) > TREES_KEPT:
                    self._spent.popitem(last=False)
            if node.handle in self._nodes:  # not already dropped (a spawn that never started, a forgotten view)
                self._ended[node.handle] = None
            self._forget_oldest_ended()
            self._changed.set()
            self._changed = trio.Event()

    def _forget_oldest_ended(self) -> None:
        """Keep the views of at most ``ENDED_KEPT`` ended subagents (a daemon's supervisor lives long), forgetting
        the one that ended first. O(1) per ending: a wide tree's children end by the hundreds at once."""
        while len(self._ended) > ENDED_KEPT:
            oldest = next(iter(self._ended))
            del self._ended[oldest]
            self._nodes.pop(oldest, None)
        self.notify_changed()

    def journal_of(self, tree: str = "") -> dict[str, Any] | None:
        """Where a child spawned in run tree ``tree`` journals its run (without its run id); None: nowhere."""
        found = self.journal_trees.get(tree) or self.journal_at
        if found is not None:
            return dict(found)
        return {"state_dir": self.journal_dir} if self.journal_dir is not None else None

    def _payload(self, admitted: Admission, request: SpawnRequest, caller: Caller) -> RunPayload:
        from agentd.supervisor.messages import RunPayload

        config = dict(self.child_config)
        if request.model is not None:
            config["model"] = request.model  # the child's gateway requests carry it; its replies are priced by it
        servers = [s for s in config.get("mcp_servers", ()) if s.get("name") in admitted.scope]
        config["mcp_servers"] = servers
        config["a2a_peers"] = [p for p in config.get("a2a_peers", ()) if p.get("name") in admitted.scope]
        secrets = referenced_secrets(config, self.secrets)  # only what the narrowed servers and peers name
        test = self.test_script(request, admitted.handle) if self.test_script is not None else None
        trace = {k: v for k, v in self.telemetry.items() if k not in (TRACEPARENT, TRACESTATE)}
        telemetry.inject(trace)  # the spawning span (the caller's execute_tool) is the child's parent
        where = self.journal_of(caller.tree) if request.journal_run is not None and not request.warm else None
        return RunPayload(
            handle=admitted.handle, depth=admitted.depth, instruction=request.instruction,
            output_contract=request.output_contract, context=list(request.context), warm=request.warm,
            history=list(request.history),
            tool_scope=sorted(admitted.scope), config=config, secrets=secrets,
            supervision=self._shared()[2], telemetry=trace, test=test,
            journal={**where, "run_id": request.journal_run, **({"new": True} if request.journal_new else {}),
                     **({"parent": True} if request.journal_parent else {})}
            if where is not None else None,
        )

    # -- by handle ------------------------------------------------------------------------------

    def _lookup(self, caller: Caller, handle: str) -> SubagentNode | Refusal:
        node = self._nodes.get(handle)
        if caller.origin is Origin.MANAGEMENT:
            owned = handle.startswith("served.")
        else:
            owned = is_within(handle, caller.handle) and handle != caller.handle
            if caller.own_tree_only and node is not None and node.tree != caller.tree:
                owned = False  # another run tree's child (another cluster item's, maybe another tenant's)
        if node is None or not owned:
            return Refusal(f"unknown subagent handle {handle[:200]}")
        return node

    def forget(self, caller: Caller, handle: str) -> None:
        """Drop an ended subagent's view now (the served surface's retention); a live one is kept."""
        node = self._lookup(caller, handle)
        if not isinstance(node, Refusal) and node.ended.is_set():
            del self._nodes[handle]
            self._ended.pop(handle, None)
            self.notify_changed()

    def status(self, caller: Caller, handle: str) -> RunView | Refusal:
        node = self._lookup(caller, handle)
        return node if isinstance(node, Refusal) else node.view()

    async def await_(self, caller: Caller, handle: str, timeout: float | None = None) -> RunView | Refusal:
        """Wait up to ``timeout`` (default ``await_timeout``); a running view means still running."""
        node = self._lookup(caller, handle)
        if isinstance(node, Refusal):
            return node
        with trio.move_on_after(self.settings.await_timeout if timeout is None else timeout):
            await node.wait_turn()
        return node.view()

    async def wait_turns(self, caller: Caller, handle: str, after: int) -> RunView | Refusal:
        """Wait until a session has answered more than ``after`` turns, or has ended (unbounded: the
        caller bounds it)."""
        node = self._lookup(caller, handle)
        if isinstance(node, Refusal):
            return node
        return await node.wait_turns(after)

    async def send(self, caller: Caller, handle: str, message: str, *, wait: bool = True) -> RunView | Refusal:
        """Give a warm session its next message; with ``wait`` return the turn's result (≤ await_timeout)."""
        node = self._lookup(caller, handle)
        if isinstance(node, Refusal):
            return node
        from agentd.supervisor.node import SessionBusy

        try:
            await node.send(message)
        except SessionBusy as exc:
            return Refusal(str(exc), retryable=node.status == "running")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return Refusal(f"handle {handle} has ended")
        if not wait:
            return node.view()
        with trio.move_on_after(self.settings.await_timeout):
            await node.wait_turn()
        return node.view()

    async def cancel(self, caller: Caller, handle: str, reason: str = "cancelled") -> RunView | Refusal:
        """Cancel a subagent and its subtree; returns once it has ended (the ladder is bounded)."""
        node = self._lookup(caller, handle)
        if isinstance(node, Refusal):
            return node
        node.cancel(reason)
        await node.ended.wait()
        return node.view()

    def cancel_subtree_of(self, handle: str, reason: str) -> None:
        """Cancel the live child of this supervisor whose subtree contains ``handle``."""
        for h, node in self._nodes.items():
            if is_within(handle, h) and not node.ended.is_set():
                node.cancel(reason)

    def cancel_own_subtree(self, reason: str) -> None:
        """Cancel this agent's own live subagents (its ``handle.*`` children), not the served ones:
        the daemon's root run ended while its supervisor keeps serving."""
        for h, node in self._nodes.items():
            if is_within(h, self.handle) and not node.ended.is_set():
                node.cancel(reason)

    def live(self) -> list[SubagentNode]:
        return [n for n in self._nodes.values() if not n.ended.is_set()]

    def own_subagents_usage(self) -> RunUsage:
        """What every subagent of the agent's own runs (all trees; not the served ones) used so far."""
        live = sum((n.usage for n in self._nodes.values() if n.tree is not None and not n.ended.is_set()),
                   RunUsage())
        return self._own_spent + live

    async def settle_run(self, tree: str = "") -> RunUsage:
        """The agent's own run in ``tree`` has its result: end the subagents it left running ("parent ended",
        down their ladders, bounded), then return what all its subagents' subtrees used, each token once, and
        forget it (a tree's count is its run's)."""
        mine = [n for n in self._nodes.values() if n.tree == tree and not n.ended.is_set()]
        for node in mine:
            node.cancel("parent ended")
        with trio.move_on_after(_ladder_bound(self.settings)):
            for node in mine:
                await node.ended.wait()
        live = sum((n.usage for n in self._nodes.values() if n.tree == tree and not n.ended.is_set()), RunUsage())
        return self._spent.pop(tree, RunUsage()) + live

    async def wait_changed(self) -> None:
        """Wait until some node of this supervisor ends (capacity may have been freed)."""
        await self._changed.wait()

    # -- observing it -----------------------------------------------------------------------------

    def statistics(self) -> SupervisorStatistics:
        """A snapshot of what this supervisor holds now (handles, statuses, pids; nothing secret)."""
        from agentd.supervisor.statistics import NodeStatistics, SupervisorStatistics

        server = self._fork_server
        ledger = self.authority.ledger if isinstance(self.authority, LocalAuthority) else None
        return SupervisorStatistics(
            handle=self.handle, draining=self.draining,
            nodes=tuple(NodeStatistics(handle=n.handle, status=n.status, pid=n.pid, ready=n.ready.is_set(),
                                       ended=n.ended.is_set(), warm=n.warm, usage_tokens=n.usage_tokens)
                        for n in self._nodes.values()),
            fork_server_pid=server.pid if server is not None and not server.gone else None,
            tree_live=ledger.live if ledger is not None else None,
            tokens_used=ledger.tokens_used if ledger is not None else None,
        )

    def notify_changed(self) -> None:
        """Wake every :meth:`wait_until` (called by the nodes, the root's ledger and the fork server)."""
        self._state_changed.set()
        self._state_changed = trio.Event()

    async def wait_until(self, predicate: Callable[[SupervisorStatistics], bool]) -> SupervisorStatistics:
        """Wait until ``predicate(self.statistics())`` holds and return that snapshot.

        Woken by each change (a node's pid, ready, status, usage or end; the root ledger's admissions,
        releases and usage; the fork server starting or going; drain starting), never by polling.
        Unbounded by itself: the caller bounds it (``fail_after``/``move_on_after``).
        """
        while True:
            changed = self._state_changed
            stats = self.statistics()
            if predicate(stats):
                return stats
            await changed.wait()

    async def wait_ready(self, handle: str) -> NodeStatistics:
        """Wait until subagent ``handle`` said ``ready`` and return its statistics (with its pid).

        Raises :class:`NotReady` if it ended without ever being ready (it could not start, crashed or
        was cancelled first), and ``KeyError`` for a handle this supervisor does not hold. Unbounded by
        itself: the caller bounds it.
        """
        node = self._nodes[handle]
        stats = await self.wait_until(lambda _: node.ready.is_set() or node.ended.is_set())
        if not node.ready.is_set():
            raise NotReady(handle, node.view())
        seen = stats.node(handle)
        assert seen is not None
        return seen

    # -- drain ----------------------------------------------------------------------------------

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting spawns, let running work finish within ``timeout``, then cancel the rest."""
        self.draining = True
        self.notify_changed()
        if isinstance(self.authority, LocalAuthority):
            self.authority.ledger.draining = True
        self.log.info("subagent.drain", live=len(self.live()))
        with trio.move_on_after(self.settings.drain_timeout if timeout is None else timeout):
            while True:
                busy = [n for n in self.live() if not (n.warm and n.status == "awaiting_turn")]
                if not busy:
                    break
                await self.wait_changed_or_turn(busy)
        for node in self.live():
            node.cancel("draining")
        for node in list(self._nodes.values()):
            await node.ended.wait()

    async def wait_changed_or_turn(self, nodes: list[SubagentNode]) -> None:
        async with trio.open_nursery() as nursery:
            async def first(waiter: Callable[[], Any]) -> None:
                await waiter()
                nursery.cancel_scope.cancel()
            nursery.start_soon(first, self.wait_changed)
            for node in nodes:
                nursery.start_soon(first, node.wait_turn)


class NotReady(Exception):
    """:meth:`Supervisor.wait_ready` on a subagent that ended before it said ``ready``."""

    def __init__(self, handle: str, view: RunView) -> None:
        super().__init__(f"subagent {handle} ended ({view.status}) before it was ready")
        self.handle = handle
        self.view = view


def _ladder_bound(settings: SupervisorSettings) -> float:
    g = settings.graces
    return g.cancel + g.eof + g.term + 10.0


def is_terminal(view: RunView) -> bool:
    from agentd.supervisor.node import TERMINAL

    return view.done or view.status in TERMINAL


@asynccontextmanager
async def open_supervisor(
    *,
    servers: frozenset[str] = frozenset(),
    server_tags: Mapping[str, Sequence[str] | None] | None = None,
    settings: SupervisorSettings | None = None,
    child_config: Mapping[str, Any] | None = None,
    secrets: Mapping[str, str] | None = None,
    telemetry: Mapping[str, Any] | None = None,
    log: EventLog | None = None,
    authority: Authority | None = None,
    handle: str = "0",
    test_script: TestScript | None = None,
    fork_server: bool = False,
    fork_connection: int | None = None,
    ledger_store: JournalStore | None = None,
    run_id: str = "",
    journal_dir: str | None = None,
    journal_at: Mapping[str, Any] | None = None,
) -> AsyncIterator[Supervisor]:
    """A supervisor whose async/warm subagents live no longer than this block.

    Without ``authority`` this is the root: it owns the tree ledger over ``servers`` (the caller's scope)
    and cancels the subtree that pushes the tree past the token ceiling. With ``fork_server`` children
    are forked from a pre-imported agentd process started on the first spawn (see ``forkserver.py``), or,
    with ``fork_connection`` (a forked child's own connection to it), from the tree's running one.
    """
    settings = settings or SupervisorSettings()
    sup_ref: list[Supervisor] = []
    if authority is None:
        ledger = TreeLedger(settings.caps, root_scope=frozenset(servers), root=handle,
                            server_tags=dict(server_tags or {}))
        authority = LocalAuthority(
            ledger, on_ceiling=lambda h: sup_ref[0].cancel_subtree_of(h, "token_ceiling") if sup_ref else None,
            on_change=lambda: sup_ref[0].notify_changed() if sup_ref else None,
            store=ledger_store, run_id=run_id, log=(log or null_log()).bind(comp="supervisor"),
        )
    async with trio.open_nursery() as nursery:
        sup = Supervisor(
            nursery=nursery, authority=authority, handle=handle, settings=settings,
            child_config={} if child_config is None else child_config,  # a ChildConfig is not read before a spawn
            secrets=secrets or {}, telemetry=telemetry or {},
            log=log or null_log(), test_script=test_script, use_fork_server=fork_server,
            fork_connection=fork_connection, journal_dir=journal_dir, journal_at=journal_at,
        )
        sup_ref.append(sup)
        try:
            yield sup
        finally:
            if sup._idle_pings is not None:
                sup._idle_pings.close()
            for node in sup.live():
                node.cancel("parent ended")
            if sup._fork_server is not None:
                with trio.CancelScope(shield=True):
                    # Children forked by the server need it to report their exits: stop it last.
                    with trio.move_on_after(_ladder_bound(settings)):
                        for node in list(sup._nodes.values()):
                            await node.ended.wait()
                    await sup._fork_server.aclose()
