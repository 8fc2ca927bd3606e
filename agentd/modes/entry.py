"""Where the daemon modes meet the rest of agentd: ``daemon_mode`` is ``agentd.daemon.MODES``' runner
for ``loop``, ``schedule`` and ``reactive``.

Unlike ``once``, a daemon opens the intelligence and the MCP pool once for its whole life (the
subscriptions live on the pool's connections) and runs every fire through :func:`loop_run_job`, the
loop with the built-in ``resource.read``, the root supervisor's ``subagent.*`` tools and the run's
self-tools. Drain comes from the CLI's latch (agentd.oversight.drain); a library caller without one gets SIGTERM
and SIGINT watched here.
"""

from __future__ import annotations

import contextlib
import functools
import signal
from collections.abc import Callable, Mapping

import attrs
import trio

from agentd.a2a.client import A2aPeers
from agentd.agent.budgets import Limits
from agentd.agent.control import ControlToolRegistry
from agentd.agent.ports import Intelligence, ToolPool
from agentd.agent.result import RunResult
from agentd.agent.runner import RunRequest, UsageHook
from agentd.client.pool import McpPool
from agentd.config.model import Config
from agentd.config.on_events import speaking_events
from agentd.config.validate import split_subscription
from agentd.intelligence.wire import Usage
from agentd.journal.store import JournalStore
from agentd.modes.continue_route import conversation_sessions, restore_session, resume_job
from agentd.modes.drivers import DaemonContext, FireOnce, Publish, run_daemon
from agentd.modes.governor import LifetimeBudget
from agentd.modes.runs import DaemonRuns, Job, RunJob
from agentd.modes.shared import Shared
from agentd.modes.watch import Origin as WatchOrigin
from agentd.oversight.operator import current_operator
from agentd.run import (
    Gateway,
    continue_children,
    ended,
    journal_end,
    journal_run,
    limits_of,
    open_run,
    outcome_of,
    reraise_if_not_an_outcome,
    run_with,
    settings_of,
    started,
)
from agentd.security.secrets import SecretResolver
from agentd.supervisor.messages import Usage as UsageFrame
from agentd.supervisor.supervisor import Caller, Origin, Supervisor
from agentd.supervisor.tools import register_subagent_tools
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from agentd.telemetry.spans import agent_span, end_agent_span
from agentd.transport.webhook_app import WebhookReceiver

#: Adds the daemon's other control tools (``subagent.*``) to a run's registry: ``(registry, run_id)``.
AddControls = Callable[[ControlToolRegistry, str], None]
#: The usage hook of one run, by its run id (the run's tokens count in its own run tree).
UsageFor = Callable[[str], UsageHook]


def loop_run_job(
    pool: ToolPool,
    intel: Intelligence,
    log: EventLog,
    *,
    output_contract: str | None = None,
    add_controls: AddControls | None = None,
    on_usage: UsageHook | None = None,
    usage_for: UsageFor | None = None,
    peers: A2aPeers | None = None,
    journal: JournalStore | None = None,
    cfg: Config | None = None,
) -> RunJob:
    """A :data:`RunJob` running the agent loop (agentd.run.run_with) with an already open pool and intelligence.

    ``usage_for(run_id)`` (when given) is each run's own usage hook, else ``on_usage`` serves them all. With
    ``journal`` each wake is journaled as its own run (its settings digest from ``cfg``).
    """

    async def run_job(job: Job, run_id: str, controls: ControlToolRegistry, limits: Limits) -> RunResult:
        if add_controls is not None:
            add_controls(controls, run_id)
        request = RunRequest(instruction=job.instruction, run_id=run_id, limits=limits,
                             output_contract=output_contract, seed=job.seed,
                             price=cfg.price() if cfg is not None else None)
        run_log = log.bind(run_id=run_id)
        journaled = None
        if journal is not None:
            journaled = await journal_run(journal, request, settings=settings_of(cfg) if cfg else {}, log=run_log,
                                          seed_runs=job.seed_runs)
            if journaled.recorded is not None:
                return journaled.recorded
            request = journaled.request
            if request.resume is not None:
                await continue_children(journaled.recorder, controls)
        with agent_span(log.agent_path, run_id, str(getattr(intel, "model", "default")), job.instruction) as span:
            result = await run_with(request, pool=pool, intel=intel, controls=controls, log=run_log,
                                    on_usage=usage_for(run_id) if usage_for is not None else on_usage, peers=peers,
                                    journal=journaled.recorder if journaled is not None else None)
            metrics.run_ended(result.status.value)
            end_agent_span(span, result.status.value, result.steps, result.usage.prompt_tokens,
                           result.usage.completion_tokens)
        await journal_end(journaled, result)
        return result

    return run_job


async def drain_on_signals(drain: trio.Event, log: EventLog) -> None:
    """Set ``drain`` on SIGTERM/SIGINT, for library callers without the CLI's latch (agentd.oversight.drain)."""
    try:
        receiver = trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT)
    except (RuntimeError, ValueError):  # not the main thread: there are no signals to watch
        return
    with receiver as signals:
        async for signum in signals:
            log.warn("proc.signal", signal=signal.Signals(signum).name, action="drain")
            drain.set()


def _drain_event(daemon: trio.Nursery, log: EventLog) -> trio.Event:
    """The CLI's drain latch when one is installed; else watch the signals ourselves."""
    from agentd.oversight.drain import installed_drain

    latch = installed_drain()
    if latch is not None:
        return latch.event
    drain = trio.Event()
    daemon.start_soon(drain_on_signals, drain, log)
    return drain


def _supervision(cfg: Config, root: Supervisor) -> tuple[AddControls, UsageFor]:
    """The root supervisor's part in the daemon's runs (``subagent.*`` tools, tree token accounting), as in once.

    ``root`` is the daemon's one root supervisor (shared with the served self-MCP). Every run (a wake) is its
    own run tree for ``--token-ceiling``: its spawns and its own usage are counted under its run id, so the
    ceiling bounds each wake and ``--budget-tokens-lifetime`` bounds the daemon.
    """

    def add_controls(registry: ControlToolRegistry, run_id: str) -> None:
        if cfg.subagents.max_depth > 0:
            register_subagent_tools(registry, root, Caller(Origin.STDIO, root.handle, tree=run_id))

    def usage_for(run_id: str) -> UsageHook:
        async def on_usage(usage: Usage, cost: int | None) -> bool | str:
            frame = UsageFrame(usage.prompt_tokens, usage.completion_tokens, usage.estimated_tokens, cost)
            return await root.authority.report_usage(root.handle, frame, tree=run_id)

        return on_usage

    return add_controls, usage_for


async def _earlier_wakes(journal: JournalStore, base: str, root: Supervisor) -> tuple[int, list[Job], list[str]]:
    """The highest wake number an earlier daemon with this run id journaled, the jobs resuming its unfinished
    wakes, oldest first (agentd.modes.runs.DaemonRuns.restore; a ``--continue`` turn's with its seed), and
    its wakes' run ids, newest first. The wakes share ``root``'s child numbering: new children are numbered after
    those the unfinished wakes journaled, so a resumed wake's handles never name another wake's child."""
    from agentd.journal.recorder import rebuild

    prefix, numbered = f"{base}.", []
    unfinished: list[tuple[int, Job]] = []
    for summary in await journal.list_runs(limit=1 << 30):
        number = summary.run_id.removeprefix(prefix)
        if summary.run_id.startswith(prefix) and number.isdigit():
            numbered.append((int(number), summary.run_id))
            if summary.ended_at is None:
                prior = await journal.read_run(summary.run_id)
                state = rebuild(prior) if prior is not None else None
                if state is not None and state.started is not None:  # no RunStarted: never began
                    unfinished.append((int(number), await resume_job(journal, summary.run_id, state)))
                    children = [h.removeprefix(root.handle + ".") for h in state.children]
                    minted = max((int(n) for n in children if n.isdigit()), default=0)
                    if minted and (ledger := getattr(root.authority, "ledger", None)) is not None:
                        ledger.mint_after(root.handle, minted)
    numbered.sort(reverse=True)
    highest = numbered[0][0] if numbered else 0
    return highest, [job for _, job in sorted(unfinished, key=lambda u: u[0])], [run_id for _, run_id in numbered]


async def _reloaded(ctx: DaemonContext, intel: Intelligence, pool: McpPool, old: Config, new: Config) -> None:
    """Apply a reload (agentd.ctl.reload's subset): the model from the next model call, the limits for the
    next runs, ``--subscribe`` re-armed now (new URIs subscribed, dropped ones unsubscribed). The MCP servers
    and endpoints were swapped before (agentd.run); what a removed server's connection watched is forgotten."""
    ctx.cfg = new
    ctx.runs.limits = limits_of(new)
    intel.model = new.intelligence.model
    ctx.server_names = [s.name for s in new.mcp]
    if ctx.watcher is not None and new.mcp != old.mcp:
        def subscribed(uri: str) -> bool:
            return any(uri in conn.watched for conn in pool.connections.values())

        for uri in ctx.watcher.orphans(pool.connections, subscribed):
            await ctx.watcher.forget(uri, "its MCP server was removed or replaced by a reload")
    if new.modes.on_events != old.modes.on_events:
        ctx.log.warn("config.warning", reason="on_events / --on-event changed: MCP event subscriptions are read at "
                     "start; restart the daemon to apply the change")
    if ctx.watcher is None or new.modes.subscribe == old.modes.subscribe:
        return
    names = list(ctx.server_names)
    if not names:
        return
    owned = ctx.continue_route.owns if ctx.continue_route is not None else (lambda uri: False)
    before = {uri: server for server, uri in (split_subscription(v, names) for v in old.modes.subscribe)}
    after = {uri: server for server, uri in (split_subscription(v, names) for v in new.modes.subscribe)}
    if ctx.shared is not None:  # the cluster re-owns: dropped ones are handed back, new ones claimed
        events = ctx.events.declared() if ctx.events is not None else []
        await ctx.shared.declare([(server, uri) for uri, server in after.items() if not owned(uri)] + events)
        return
    for uri in sorted(before.keys() - after.keys()):
        if not owned(uri):
            await ctx.watcher.unwatch(uri, WatchOrigin.CONFIG)
    for uri in sorted(after.keys() - before.keys()):
        if owned(uri):
            continue
        try:
            await ctx.watcher.watch(uri, WatchOrigin.CONFIG, after[uri])
        except Exception as exc:  # the server is down, say: the rest of the reload stands
            ctx.log.warn("mcp.subscribe", uri=uri, action="subscribe", origin="config", applied=False,
                         reloaded=True, error=type(exc).__name__, reason=str(exc))


async def daemon_mode(cfg: Config, log: EventLog, daemon: trio.Nursery, *, supervisor: Supervisor,
                      env: Mapping[str, str] | None = None, drain: trio.Event | None = None,
                      publish: Publish | None = None, journal: JournalStore | None = None,
                      fire_once: FireOnce | None = None, shared: Shared | None = None,
                      webhooks: WebhookReceiver | None = None) -> RunResult:
    """Run ``cfg.mode`` as a daemon until drained (exit 0), stopped by the breaker (1) or budget (7/0).

    ``supervisor`` is the daemon's root supervisor (agentd.daemon.main's); ``drain`` defaults to the CLI's latch
    (agentd.oversight.drain); ``env`` is where secret references are looked up; ``publish`` shows the daemon's status to
    ``agent://status``. The intelligence and the pool are opened once for the daemon's life (agentd.run).
    ``journal`` (``--state-dir``) journals every wake; wakes left unfinished by an earlier process with the
    same run id are resumed from their last committed step and the numbering continues after them.
    ``shared`` (``--cluster``) owns the subscriptions and self-scheduled runs with the other members.
    """
    if drain is None:
        drain = _drain_event(daemon, log)
    resolver = SecretResolver(env=env, redactor=log.redactor)
    limits = limits_of(cfg)
    gateway = Gateway.of(cfg)
    started(log, mode=cfg.mode, servers=[s.name for s in cfg.mcp], daemon=True, model=cfg.intelligence.model,
            intelligence=gateway.shown())
    try:
        async with open_run(gateway, speaking_events(cfg.mcp, cfg.modes.on_events), log=log, secrets=resolver, run_id=log.run_id,
                            a2a_peers=cfg.a2a_peers, egress=cfg.egress.policy()) as opened:
            add_controls, usage_for = _supervision(cfg, supervisor)
            daemon_log = log.bind(comp="reactive")
            runs = DaemonRuns(
                loop_run_job(opened.pool, opened.intel, log, output_contract=cfg.output_contract,
                             add_controls=add_controls, usage_for=usage_for, peers=opened.peers,
                             journal=journal, cfg=cfg),
                base_run_id=log.run_id,
                limits=limits,
                log=daemon_log,
                budget=LifetimeBudget(cfg.budgets.tokens_lifetime),
                state=journal,
                shared=shared,
            )
            restored = None
            if journal is not None:
                runs.runs, runs.unfinished, earlier = await _earlier_wakes(journal, log.run_id, supervisor)
                if cfg.modes.continue_uris:  # the session's turns, and its turn left unfinished, resumed by the session
                    restored = await restore_session(journal, earlier)
                    interrupted = restored.interrupted.resume if restored.interrupted is not None else None
                    runs.unfinished = [job for job in runs.unfinished if job.resume != interrupted]
            ctx = DaemonContext(cfg, runs, daemon_log, drain, pool=opened.pool, server_names=[s.name for s in cfg.mcp],
                                open_session=conversation_sessions(runs, restored),
                                publish=publish, fire_once=fire_once, shared=shared, webhooks=webhooks)
            operator = current_operator()
            with (operator.reloadable(functools.partial(_reloaded, ctx, opened.intel, opened.pool))
                  if operator is not None
                  else contextlib.nullcontext()):
                result = await run_daemon(ctx)
    except BaseException as exc:
        reraise_if_not_an_outcome(exc, log)  # a bad --subscribe (ConfigError) is exit 2; cancellation unwinds
        result = outcome_of(exc, run_id=log.run_id, log=log)
    # The daemon's usage is its whole tree's: every wake's own, and every subagent the wakes spawned.
    result = attrs.evolve(result, subagents=supervisor.own_subagents_usage())
    ended(log, result, daemon=True)
    return result
