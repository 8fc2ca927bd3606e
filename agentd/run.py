"""One run, composed in one place: what it opens, how it ends, and what it says about itself.

Every run of agentd goes through here: the daemon's once run and a subagent's turn (:func:`run_config`), each
wake of the loop, schedule and reactive modes (:func:`run_with`, on the daemon's long-lived context), and
``agentd run``'s manifest steps. So they all

- open the same way: :func:`open_run` opens the intelligence client and the MCP pool inside the run's
  deadline (a server that accepts and never answers spends the run's time, not more);
- end by the same rule: :func:`outcome_of` turns whatever escaped (trio wraps it in exception groups) into
  one :class:`RunResult`, so a failure has the same exit code whichever layer sees it;
- say ``run.start`` and ``run.end`` with the same fields (:func:`started`, :func:`ended`);
- with a journal (``--state-dir``, opened once by the daemon with :func:`open_state`), are journaled the same
  way (:func:`journal_run`, :func:`journal_end`): ``RunStarted``, every step as the loop commits it,
  ``RunEnded``. A run whose id is already in the journal unfinished is *resumed* from its last committed step;
  one already finished is not run again (its recorded result is returned). docs/durability.md.

Decisions are data: :func:`agentd.errors.flatten` names the one exception a group stands for,
:func:`outcome_of` maps it to a status. Cancellation and configuration errors are not run outcomes; they propagate.
"""

from __future__ import annotations

import contextlib
import functools
import math
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from agentd import defaults
from agentd.agent.budgets import Limits
from agentd.agent.builtin import resource_read_tool
from agentd.agent.control import ControlToolRegistry
from agentd.agent.ports import Intelligence, ToolPool
from agentd.agent.result import RunResult, RunStatus, RunUsage
from agentd.agent.runner import Resume, RunRequest, StepJournal, UsageHook, run_loop
from agentd.client import open_mcp_pool
from agentd.client.pool import McpPool, StagedServers
from agentd.config.model import Config, McpServerConfig
from agentd.config.on_events import speaking_events
from agentd.errors import AgentdError, ConfigError, ExitCode, flatten, leaves
from agentd.intelligence import open_intelligence
from agentd.intelligence.endpoints import OFFLINE, display
from agentd.intelligence.wire import ToolCall
from agentd.oversight.operator import Operator, current_operator
from agentd.security.secrets import SecretResolver
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from agentd.telemetry.spans import agent_span, end_agent_span
from agentd.transport.egress import EgressPolicy

if TYPE_CHECKING:  # imported where used: a run without A2A peers or a journal loads neither
    from agentd.a2a.client import A2aPeers
    from agentd.intelligence.swap import Held, SwappableIntelligence
    from agentd.journal.recorder import RunRecorder
    from agentd.journal.store import JournalStore


class ConnectDeadline(AgentdError):
    """The run's deadline passed while the intelligence or the MCP servers were still being opened."""

    exit_code = ExitCode.BUDGET


@attrs.frozen
class Gateway:
    """The intelligence a run thinks with: endpoints (failover order), model, token reference, streaming."""

    endpoints: tuple[str, ...]
    model: str
    token: str | None = attrs.field(default=None, repr=False)
    stream: bool = False

    @classmethod
    def of(cls, cfg: Config) -> Gateway:
        return cls(tuple(cfg.intelligence.endpoints), cfg.intelligence.model, cfg.intelligence.token, cfg.intelligence.stream)

    def shown(self) -> list[str]:
        """The endpoints as events may show them (no credentials in a URL)."""
        return [url if url == OFFLINE else display(url) for url in self.endpoints]


@attrs.frozen
class Opened:
    """What :func:`open_run` opened, and when the run's time ends (trio clock; ``inf`` for none)."""

    intel: Intelligence
    pool: McpPool
    #: The connected A2A peers (docs/a2a.md); None when none are declared.
    peers: A2aPeers | None
    end: float = math.inf

    def remaining(self) -> float:
        return max(self.end - trio.current_time(), 1e-3) if self.end != math.inf else math.inf


#: Held open around a run's loop once its pool is open (``run_config(beside=...)``).
Beside = Callable[[Opened], contextlib.AbstractAsyncContextManager[None]]


def limits_of(cfg: Config) -> Limits:
    return Limits(max_steps=cfg.budgets.max_steps, max_tokens=cfg.budgets.max_tokens, deadline=cfg.budgets.deadline)


@asynccontextmanager
async def open_run(
    gateway: Gateway,
    servers: Sequence[McpServerConfig],
    *,
    log: EventLog,
    secrets: SecretResolver,
    run_id: str,
    deadline: float = math.inf,
    a2a_peers: Sequence[McpServerConfig] = (),
    egress: EgressPolicy | None = None,
    pool: McpPool | None = None,
) -> AsyncIterator[Opened]:
    """Open the intelligence, the MCP pool and the A2A peers for one run (or one daemon's life) and hold them.
    With ``pool`` (its owner opened it, closes it and applies reloads to it) ``servers`` are not opened.

    ``deadline`` (seconds from now) bounds the opening too; once both are open the block owns the rest of the
    time (``Opened.remaining()``), and this scope stops binding. ``egress`` (the config file's ``egress.allow``)
    is what every connection is held to: one that lands on a link-local/cloud metadata address it does not name
    is refused, whether the endpoint named the address or a DNS name that resolves there.

    Raises:
        ConnectDeadline: the deadline passed while opening (exit 7, status ``deadline``).
        McpConnectError: a required server failed its handshake (exit 6); A2aConnectError: a required A2A
            peer is unreachable or its card is invalid (exit 6).
        IntelligenceError: the gateway configuration is unusable (exit 4).
    """
    end = trio.current_time() + deadline
    connected = False
    operator = current_operator()
    try:
        with trio.CancelScope(deadline=end) as opening:
            async with (
                _open_gateway(gateway, log=log, secrets=secrets, egress=egress, swappable=operator is not None
                              ) as intel,
                open_mcp_pool(servers, log=log, secrets=secrets, run_id=run_id, egress=egress) if pool is None
                else _held(pool) as opened_pool,
                _open_peers(a2a_peers, log=log, secrets=secrets, egress=egress) as peers,
            ):
                opening.deadline = math.inf
                connected = True
                with _reloadable_connections(intel, opened_pool, log=log, secrets=secrets, egress=egress,
                                             servers_too=pool is None):
                    yield Opened(intel, opened_pool, peers, end)
    except BaseException:
        if connected or not opening.cancel_called:
            raise
    if not connected:  # cut short by the deadline (whatever the half-open connections raised meanwhile)
        raise ConnectDeadline(f"the run deadline ({deadline:g} s) passed while connecting")


@asynccontextmanager
async def _held(pool: McpPool) -> AsyncIterator[McpPool]:
    """A pool another owner opened and closes (``run_config(shared=...)``)."""
    yield pool


def _open_gateway(gateway: Gateway, *, log: EventLog, secrets: SecretResolver, egress: EgressPolicy | None,
                  swappable: bool = False) -> contextlib.AbstractAsyncContextManager[Intelligence]:
    """The intelligence client for ``gateway``; ``swappable`` (under an operator): one a reload may replace."""
    opener = functools.partial(open_intelligence, list(gateway.endpoints), model=gateway.model, token=gateway.token,
                               stream=gateway.stream, log=log, secrets=secrets, egress=egress)
    if not swappable:
        return opener()
    from agentd.intelligence.swap import open_swappable

    return open_swappable(opener)


class _Reopened:
    """What a reload staged for one open run: new intelligence endpoints and/or MCP servers (agentd.oversight.operator).
    (A plain class: this module loads at a once run's start-up.)"""

    __slots__ = ("endpoints", "intel", "operator", "pool", "servers", "shown")

    def __init__(self, intel: SwappableIntelligence, pool: McpPool, operator: Operator, *,
                 shown: list[str] | None = None) -> None:
        self.intel = intel
        self.pool = pool
        self.operator = operator
        self.endpoints: Held | None = None
        self.servers: StagedServers | None = None
        self.shown: list[str] = [] if shown is None else shown

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.servers is not None:
            out["mcp"] = self.servers.changes.to_json()
        if self.endpoints is not None:
            out["intelligence"] = self.shown
        return out

    async def commit(self) -> None:
        if self.endpoints is not None:
            self.intel.commit(self.endpoints)
        if self.servers is not None:
            await self.pool.commit(self.servers, self.operator.turns_passed)

    def discard(self) -> None:
        if self.endpoints is not None:
            self.intel.discard(self.endpoints)
        if self.servers is not None:
            self.pool.discard(self.servers)


def _reloadable_connections(intel: Intelligence, pool: McpPool, *, log: EventLog, secrets: SecretResolver,
                            egress: EgressPolicy | None, servers_too: bool = True
                            ) -> contextlib.AbstractContextManager[None]:
    """Under an operator, a reload reopens this run's intelligence endpoints and MCP servers (agentd.ctl.reload):
    opened beside the running ones, swapped in at once (the next model call, the next turn's catalogue), the
    replaced ones closed when their calls in flight finished. Not ``servers_too``: the pool is another's, whose
    owner reopens its servers."""
    operator = current_operator()
    if operator is None:
        return contextlib.nullcontext()
    from agentd.intelligence.swap import SwappableIntelligence

    if not isinstance(intel, SwappableIntelligence):
        return contextlib.nullcontext()

    async def stage(old: Config, new: Config) -> _Reopened | None:
        before, after = Gateway.of(old), Gateway.of(new)
        staged = _Reopened(intel, pool, operator, shown=after.shown())
        if attrs.evolve(before, model=after.model) != after:  # the model alone is swapped by an applier
            staged.endpoints = await intel.stage(functools.partial(
                open_intelligence, list(after.endpoints), model=after.model, token=after.token, stream=after.stream,
                log=log, secrets=secrets, egress=egress))
        if servers_too and tuple(new.mcp) != tuple(old.mcp):
            try:  # as the daemon connected them: a server an --on-event names on the 2026-07-28 wire
                staged.servers = await pool.stage(speaking_events(new.mcp, new.modes.on_events))
            except BaseException:
                staged.discard()
                raise
        return staged if staged.endpoints is not None or staged.servers is not None else None

    return operator.staging(stage)


@asynccontextmanager
async def _open_peers(declared: Sequence[McpServerConfig], *, log: EventLog, secrets: SecretResolver,
                      egress: EgressPolicy | None) -> AsyncIterator[A2aPeers | None]:
    """The A2A peers, or None (and the A2A client not even imported) when none are declared."""
    if not declared:
        yield None
        return
    from agentd.a2a.client import open_a2a_peers

    async with open_a2a_peers(declared, log=log, secrets=secrets, egress=egress) as peers:
        yield peers


# --- how a run ends --------------------------------------------------------------------------------------------


_STATUS_OF_EXIT: Mapping[ExitCode, RunStatus] = {
    ExitCode.MCP_REQUIRED: RunStatus.MCP_FAILED,
    ExitCode.INTELLIGENCE: RunStatus.INTELLIGENCE_FAILED,
    ExitCode.BUDGET: RunStatus.DEADLINE,
    ExitCode.REFUSED: RunStatus.REFUSED,
}


def is_cancellation(exc: BaseException) -> bool:
    """Cancelled from outside (a forced drain, a parent's kill ladder, Ctrl-C): not a run outcome."""
    return any(isinstance(leaf, trio.Cancelled | KeyboardInterrupt) for leaf in leaves(exc))


def outcome_of(exc: BaseException, *, run_id: str, log: EventLog) -> RunResult:
    """The one rule for a run that raised ``exc``: its :class:`RunResult`.

    Our own errors map by their exit code (a required server down is ``mcp_failed``, the gateway
    ``intelligence_failed``, the deadline while connecting ``deadline``, anything else ``failed``); anything
    else is a bug, reported as ``crashed`` with its traceback in a ``run.failed`` event, so stdout still carries
    one result. The caller re-raises cancellation (:func:`is_cancellation`) and ``ConfigError`` itself.
    """
    leaf = flatten(exc)
    if isinstance(leaf, AgentdError):
        status = _STATUS_OF_EXIT.get(leaf.exit_code, RunStatus.FAILED)
        return RunResult(run_id=run_id, status=status, error=str(leaf), partial=status is RunStatus.DEADLINE)
    error = f"{type(leaf).__name__}: {leaf}"
    log.error("run.failed", error=error, traceback="".join(traceback.format_exception(leaf)[-12:]))
    return RunResult(run_id=run_id, status=RunStatus.CRASHED, error=error)


def reraise_if_not_an_outcome(exc: BaseException, log: EventLog, *, say: bool = True) -> None:
    """Re-raise what is not a run outcome: cancellation and config errors. The run that was cancelled says so
    once as ``run.cancelled`` (``say``); an enclosing layer that sees the same cancellation passes False."""
    if is_cancellation(exc):
        if say:
            log.warn("run.cancelled", reason="the run was cancelled from outside")
        raise exc
    leaf = flatten(exc)
    if isinstance(leaf, ConfigError):
        raise leaf from None


# --- what a run says -------------------------------------------------------------------------------------------


def started(log: EventLog, *, mode: str, servers: Sequence[str], **fields: Any) -> None:
    log.info("run.start", mode=mode, servers=list(servers), **fields)


def ended(log: EventLog, result: RunResult, **fields: Any) -> None:
    log.emit(
        "run.end",
        "info" if result.status is RunStatus.COMPLETED else "warn",
        status=result.status.value,
        exit_code=int(result.exit_code),
        partial=result.partial,
        steps=result.steps,
        usage=result.usage_json(),
        **fields,
        **({"error": result.error} if result.error else {}),
    )


# --- the journal ------------------------------------------------------------------------------------------------


@asynccontextmanager
async def open_state(state_dir: str | None, *, log: EventLog, keep_for: float = defaults.JOURNAL_KEEP_FOR,
                     keep_runs: int = defaults.JOURNAL_KEEP_RUNS) -> AsyncIterator[JournalStore | None]:
    """The daemon's journal under ``state_dir`` for the block (``None`` and nothing opened without one).

    A state directory that cannot be opened is a :class:`ConfigError` (exit 2) before anything runs. On
    opening, finished runs outside the retention (``keep_for`` seconds and ``keep_runs`` runs, 0: no bound;
    :class:`~agentd.journal.store.Retention`) are pruned and the
    unfinished runs are named in ``journal.opened`` (a run resumes when a run with its id is started again).
    """
    if state_dir is None:
        yield None
        return
    from agentd.journal.errors import JournalError
    from agentd.journal.sqlite import open_journal  # sqlite3: only for a daemon with a state directory
    from agentd.journal.store import KEPT_RUNS, Retention

    opened = False
    try:
        async with open_journal(state_dir, redactor=log.redactor) as journal:
            retention = Retention.of(keep_for, keep_runs, await journal.get_state(KEPT_RUNS))
            pruned = await journal.prune(attrs.evolve(retention, keep=retention.keep | await _children_kept(journal)))
            unfinished = [r.run_id for r in await journal.unfinished_runs()]
            await _drop_finished_budgets(journal, set(unfinished))
            log.info("journal.opened", path=journal.path, pruned=pruned, unfinished=unfinished)
            opened = True
            yield journal
    except JournalError as exc:
        if opened:
            raise
        # Before anything ran: an unusable state directory is a configuration problem (exit 2).
        raise ConfigError(f"--state-dir: {exc}") from None


async def _children_kept(journal: JournalStore) -> frozenset[str]:
    """The runs of the subagents of unfinished runs (``PARENT/...``, at any depth), finished or not: a resumed
    parent's spawn made again resumes or replays its child's run, so retention must not remove it first."""
    unfinished = {r.run_id for r in await journal.unfinished_runs()}
    if not unfinished:
        return frozenset()

    def under(run_id: str) -> bool:
        cut = run_id.find("/")
        while cut > 0:
            if run_id[:cut] in unfinished:
                return True
            cut = run_id.find("/", cut + 1)
        return False

    return frozenset(r.run_id for r in await journal.list_runs(limit=1 << 30) if under(r.run_id))


async def _drop_finished_budgets(journal: JournalStore, unfinished: set[str]) -> None:
    """Forget the token budget books (agentd.supervisor.caps) of runs that finished: only an unfinished run
    is resumed with its books."""
    from agentd.journal.ledger import NAMESPACE

    stale = {tree: None for tree in await journal.get_state(NAMESPACE) if tree not in unfinished}
    if stale:
        await journal.put_state(NAMESPACE, stale)


@attrs.frozen
class Journaled:
    """A run as the journal starts it: the request (with its :class:`Resume` when recovered), the recorder,
    or the recorded result of a run that had already finished (then nothing runs)."""

    request: RunRequest
    recorder: RunRecorder
    recorded: RunResult | None = None
    #: The run may have saved token budget books (a root's run, keyed by its id): forgotten at its end. A
    #: subagent's run never has (the tree's books are the root's, agentd.supervisor.authority).
    books: bool = True


def settings_of(cfg: Config) -> dict[str, Any]:
    """The settings a run's ``config_digest`` covers (not its id, its state directory or its telemetry)."""
    skip = {"run_id", "state_dir", "log_level", "log_content", "instruction", "instruction_file"}
    from agentd.config.model import flattened  # flat names: a grouping of the settings changes no digest

    return {k: v for k, v in flattened(attrs.asdict(cfg, recurse=True)).items() if k not in skip}


async def journal_run(journal: JournalStore, request: RunRequest, *, settings: Mapping[str, Any], log: EventLog,
                      parent: str | None = None, seed_runs: tuple[str, ...] | None = None,
                      new: bool = False, parent_commits_end: bool = False) -> Journaled:
    """Start ``request`` in the journal: a new run gets its ``RunStarted``; an unfinished one is resumed.

    ``seed_runs`` (a ``--continue`` turn) names the runs of the earlier turns its seed is made of: journaled as
    references instead of a copy of the seed (agentd.modes.continue_route rebuilds it from them).

    ``new``: the parent knows no process journaled this run before (a child of a run started in the parent's
    own process): the journal is not read, and ``RunStarted`` goes with the run's first commit.
    ``parent_commits_end``: the parent run takes this run's end as a tool call's outcome and commits it
    (agentd.journal.recorder.RunRecorder.parent_commits_end).

    Raises:
        ConfigError: the run id names a journaled run with another instruction (exit 2, nothing written).
    """
    from agentd.journal.recorder import RunRecorder, config_digest, rebuild
    from agentd.journal.records import RunStarted

    recorder = RunRecorder(journal, request.run_id, parent_commits_end=parent_commits_end)
    books = parent is None
    prior = None if new else await journal.read_run(request.run_id)
    if prior is None or rebuild(prior).started is None:  # new, or only claimed by a cluster member so far
        await recorder.started(RunStarted(config_digest(settings), request.instruction,
                                          request.output_contract, parent, seed_runs, request.key_nonce),
                               deferred=new)
        return Journaled(request, recorder, books=books)
    state = rebuild(prior)
    # the journal holds the instruction with known secret values redacted (agentd.journal.records.redacted)
    if state.started is not None and state.started.instruction not in (
            request.instruction, log.redactor.scrub(request.instruction)):
        raise ConfigError(f"--run-id {request.run_id!r} names a journaled run with another instruction; "
                          "use another --run-id (or the same instruction to resume it)")
    if state.ended is not None:
        log.info("run.replayed", status=state.ended.status, steps=state.steps)
        return Journaled(request, recorder, _recorded(request.run_id, state.ended.status, state.ended.result,
                                                      state.ended.error), books)
    resume = Resume(messages=state.messages, steps=state.steps, prompt_tokens=state.prompt_tokens,
                    completion_tokens=state.completion_tokens,
                    pending=tuple(ToolCall(p.call_id, p.name, p.arguments) for p in state.pending),
                    tasks={p.call_id: p.task_id for p in state.pending if p.task_id is not None},
                    approvals={p.call_id: (p.approval, p.reason) for p in state.pending if p.approval is not None})
    recorder.earlier_children = state.children
    recorder.child_runs = state.child_runs
    # Subagents do not survive their parent: an async one with a journaled run resumes under its handle (the
    # run's subagent tools, ControlToolRegistry.resume), any other is recorded lost (a warm one interrupted).
    recorder.resumable = state.resumable
    resuming = {child.handle for child in state.resumable}
    lost = [h for h in state.open_children if h not in resuming]
    if lost:
        await recorder.lost(lost, state.warm_children)
    if state.unanswered:  # a server's question that waited: its request died with that process
        from agentd.agent.asks import LOST

        for question in state.unanswered:
            await recorder.elicitation_decided(question.step, question.call_id, "cancel", None, LOST)
            log.warn("elicitation.decided", server=question.server, step=question.step, call_id=question.call_id,
                     action="cancel", waited_s=None, reason=LOST)
    log.info("run.resumed", steps=state.steps, records=prior.summary.records, pending=len(resume.pending),
             lost_children=lost, resumed_children=sorted(resuming))
    # The calls are named as the first process named them (an older journal has no nonce: keys without one).
    nonce = state.started.key_nonce if state.started is not None else None
    return Journaled(attrs.evolve(request, resume=resume, key_nonce=nonce or ""), recorder, books=books)


async def journal_end(journaled: Journaled | None, result: RunResult) -> None:
    """Commit ``RunEnded`` (flushed, unless a parent run commits it) and forget the run's token budget books. A
    drained run is left unfinished (books kept): the next start resumes it."""
    if journaled is None or journaled.recorded is not None:
        return
    if result.drained:
        await journaled.recorder.commit_started()  # anything held, not the end
        return
    await journaled.recorder.ended(result.status.value, result.to_json(), result.error)
    if not journaled.books:
        return
    from agentd.journal.errors import JournalError
    from agentd.journal.ledger import drop_ledger

    try:
        await drop_ledger(journaled.recorder.store, journaled.recorder.run_id)  # a finished run needs no books
    except JournalError:
        pass  # the next start forgets them (open_state)


async def _commit_started(recorder: RunRecorder) -> None:
    """A run that raised before its first commit: its deferred ``RunStarted`` committed (shielded, bounded), so
    that it is journaled as how it ended decides (ended, or left unfinished to resume)."""
    from agentd.journal.errors import JournalError

    with trio.CancelScope(shield=True), trio.move_on_after(defaults.JOURNAL_CANCEL_COMMIT):
        try:
            await recorder.commit_started()
        except JournalError:
            pass  # nothing of the run journaled: a resumed parent's spawn starts it again


async def continue_children(recorder: RunRecorder, controls: ControlToolRegistry | None) -> None:
    """A resumed run's async subagents continue beside it (its subagent tools resume them under their
    handles); any its tools did not take up is recorded lost."""
    if controls is not None:
        await controls.resume(recorder)
    left = recorder.resumable_children()
    if left:
        await recorder.lost([child.handle for child in left])


def _recorded(run_id: str, status: str, recorded: Any, error: str | None) -> RunResult:
    body = recorded if isinstance(recorded, Mapping) else {}
    usage: Mapping[str, Any] = body["usage"] if isinstance(body.get("usage"), Mapping) else {}
    tree = RunUsage.from_json(usage)
    own = RunUsage.from_json(usage["own"]) if isinstance(usage.get("own"), Mapping) else tree
    try:
        value = RunStatus(status)
    except ValueError:
        value = RunStatus.FAILED
    return RunResult(run_id=run_id, status=value, partial=bool(body.get("partial", False)),
                     result=body.get("result"), steps=int(body.get("steps", 0) or 0),
                     usage=own, subagents=RunUsage(max(0, tree.prompt_tokens - own.prompt_tokens),
                                                   max(0, tree.completion_tokens - own.completion_tokens),
                                                   max(0, tree.estimated_tokens - own.estimated_tokens),
                                                   None if tree.cost is None or own.cost is None
                                                   else max(0, tree.cost - own.cost)),
                     error=error)


def _reloadable_model(intel: Intelligence) -> contextlib.AbstractContextManager[None]:
    """A daemon's reload (agentd.ctl) swaps the model of a run in flight from its next model call."""
    operator = current_operator()
    if operator is None:
        return contextlib.nullcontext()

    async def swap(_old: Config, new: Config) -> None:
        intel.model = new.intelligence.model

    return operator.reloadable(swap)


# --- the loop's runs -------------------------------------------------------------------------------------------


async def run_with(
    request: RunRequest,
    *,
    pool: ToolPool,
    intel: Intelligence,
    log: EventLog,
    controls: ControlToolRegistry | None = None,
    on_usage: UsageHook | None = None,
    peers: A2aPeers | None = None,
    journal: StepJournal | None = None,
) -> RunResult:
    """Run the loop once with everything already open (a wake uses the daemon's pool and intelligence).

    Registers ``resource.read`` unless the registry already has one, and the ``a2a.*`` tools when ``peers``
    has a connected peer; the caller's other control tools (``subagent.*``, ``subscribe``, …) are offered as
    they are. With ``journal`` (a :func:`journal_run` recorder), the loop commits every step to it; the
    caller commits the end (:func:`journal_end`).
    """
    registry = controls if controls is not None else ControlToolRegistry()
    builtin = resource_read_tool(pool)
    if builtin.name not in registry:
        registry.register(builtin)
    if peers is not None and peers.peers:
        from agentd.agent.a2a import register_a2a_tools

        register_a2a_tools(registry, peers)
    return await run_loop(request, pool=pool, intel=intel, controls=registry, log=log, on_usage=on_usage,
                          journal=journal)


async def run_config(
    cfg: Config,
    *,
    run_id: str,
    log: EventLog,
    env: Mapping[str, str] | None = None,
    instruction: str | None = None,
    output_contract: str | None = None,
    servers: Sequence[McpServerConfig] | None = None,
    limits: Limits | None = None,
    controls: ControlToolRegistry | None = None,
    on_usage: UsageHook | None = None,
    seed: Sequence[Mapping[str, Any]] = (),
    journal: JournalStore | None = None,
    parent: str | None = None,
    settle: Callable[[], Awaitable[RunUsage]] | None = None,
    beside: Beside | None = None,
    shared: Opened | None = None,
    new_run: bool = False,
    settings: Mapping[str, Any] | None = None,
    parent_commits_end: bool = False,
) -> RunResult:
    """One whole run described by ``cfg`` (each keyword overrides its part): open, run the loop, end.

    The daemon's once run calls this; so does a subagent's turn, with the spawn payload's instruction, server
    subset, limits and context seed. Emits ``run.start`` and ``run.end``. With ``journal`` the run is
    journaled, resumed when unfinished, or answered from the journal when already finished. ``settle`` (the
    supervisor's, for a run that may spawn) is awaited once the loop has its result: it ends the subagents
    the run left running and returns what its subagents used, which the result's usage counts. ``beside``
    (the once run's in-run ``subscribe``, agentd.modes.once) is held open around the loop once the run's
    pool is: what it enters may register control tools on ``controls`` that use that pool. ``shared`` (a
    cluster member's claimed runs, as a daemon's wakes share the daemon's pool) is what another owner opened:
    the run uses its MCP pool instead of opening its own (the model client and A2A peers are still the run's).
    ``new_run`` (a child whose parent knows its journaled run is new): see :func:`journal_run`. ``settings``: what
    the journaled run's ``config_digest`` covers, when the caller holds it as plain data already (a child: its
    wire config); else :func:`settings_of` ``cfg``. ``parent_commits_end`` (a child whose parent run takes its
    result as a tool call's outcome): its ``run.ended`` is not flushed (:func:`journal_run`).
    """
    log = log.bind(run_id=run_id)
    request = RunRequest(
        instruction=instruction if instruction is not None else (cfg.instruction or ""),
        run_id=run_id,
        limits=limits or limits_of(cfg),
        output_contract=output_contract if output_contract is not None else cfg.output_contract,
        seed=tuple(seed),
        price=cfg.price(),
    )
    if not request.instruction.strip():
        raise ConfigError("an instruction is required (--instruction or --instruction-file)")
    declared = tuple(cfg.mcp if servers is None else servers)
    journaled: Journaled | None = None
    if journal is not None:
        journaled = await journal_run(journal, request, settings=settings_of(cfg) if settings is None else settings,
                                      log=log, parent=parent, new=new_run, parent_commits_end=parent_commits_end)
        if journaled.recorded is not None:
            return journaled.recorded
        request = journaled.request
    gateway = Gateway.of(cfg)
    # The run's span covers opening (handshakes, listings) as well as the loop: one span per run.
    with agent_span(log.agent_path, run_id, cfg.intelligence.model, request.instruction) as span:
        started(log, mode=cfg.mode, servers=[s.name for s in declared],
                instruction=log.content(request.instruction), intelligence=gateway.shown(), model=cfg.intelligence.model,
                max_steps=request.limits.max_steps, max_tokens=request.limits.max_tokens,
                deadline=request.limits.deadline)
        resolver = SecretResolver(env=env, redactor=log.redactor)
        try:
            if journaled is not None and request.resume is not None:
                await continue_children(journaled.recorder, controls)
            async with open_run(gateway, declared, log=log, secrets=resolver, run_id=run_id,
                                deadline=request.limits.deadline, a2a_peers=cfg.a2a_peers,
                                egress=cfg.egress.policy(), pool=shared.pool if shared is not None else None
                                ) as opened:
                # The loop owns what is left of the deadline (its own move_on_after keeps the best result so far).
                rest = attrs.evolve(request, limits=attrs.evolve(request.limits, deadline=opened.remaining()))
                async with beside(opened) if beside is not None else contextlib.nullcontext():
                    with _reloadable_model(opened.intel):
                        result = await run_with(rest, pool=opened.pool, intel=opened.intel, log=log,
                                                controls=controls, on_usage=on_usage, peers=opened.peers,
                                                journal=journaled.recorder if journaled is not None else None)
        except BaseException as exc:
            if journaled is not None:  # cancelled or failed before its first commit: journaled as started
                await _commit_started(journaled.recorder)
            reraise_if_not_an_outcome(exc, log)
            if isinstance(flatten(exc), ConnectDeadline):
                log.warn("loop.budget", budget=RunStatus.DEADLINE.value, steps=0,
                         max_steps=request.limits.max_steps, tokens=0, max_tokens=request.limits.max_tokens,
                         deadline=request.limits.deadline)
            result = outcome_of(exc, run_id=run_id, log=log)
        if settle is not None:
            result = attrs.evolve(result, subagents=await settle())
        await journal_end(journaled, result)
        metrics.run_ended(result.status.value)
        end_agent_span(span, result.status.value, result.steps, result.usage.prompt_tokens,
                       result.usage.completion_tokens, result.usage.cost)
        ended(log, result)
    return result


__all__ = [
    "Beside",
    "ConnectDeadline",
    "Gateway",
    "Journaled",
    "Opened",
    "continue_children",
    "ended",
    "is_cancellation",
    "journal_end",
    "journal_run",
    "limits_of",
    "open_run",
    "open_state",
    "outcome_of",
    "reraise_if_not_an_outcome",
    "run_config",
    "run_with",
    "settings_of",
    "started",
]
