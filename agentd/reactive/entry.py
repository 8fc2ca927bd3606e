"""Where the daemon modes meet the rest of agentd: ``daemon_mode`` is ``agentd.daemon.MODES``' runner
for ``loop``, ``schedule`` and ``reactive``.

Unlike ``once``, a daemon opens the intelligence and the MCP pool once for its whole life (the
subscriptions live on the pool's connections) and runs every fire through :func:`loop_run_job`, the
loop with the built-in ``resource.read`` plus the run's self-tools. SIGTERM and SIGINT set the drain
latch (a second signal does not force anything here: drain is already bounded by --drain-timeout).
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import trio

from agentd.config.model import Config
from agentd.errors import AgentdError, IntelligenceError, McpConnectError
from agentd.events import EventLog
from agentd.loop.budgets import Limits
from agentd.loop.builtin import resource_read_tool
from agentd.loop.control import ControlToolRegistry
from agentd.loop.ports import Intelligence, ToolPool
from agentd.loop.result import RunResult, RunStatus
from agentd.loop.runner import RunRequest, run_loop
from agentd.reactive.continue_route import conversation_sessions
from agentd.reactive.governor import LifetimeBudget
from agentd.reactive.modes import DaemonContext, lone_agentd_error, run_daemon
from agentd.reactive.runs import DaemonRuns, Job, RunJob

#: Adds the daemon's other control tools (``subagent.*``) to a run's registry: ``(registry, run_id)``.
AddControls = Callable[[ControlToolRegistry, str], None]


def loop_run_job(
    pool: ToolPool,
    intel: Intelligence,
    log: EventLog,
    *,
    output_contract: str | None = None,
    add_controls: AddControls | None = None,
) -> RunJob:
    """A :data:`RunJob` running the agent loop with an already open pool and intelligence."""

    async def run_job(job: Job, run_id: str, controls: ControlToolRegistry, limits: Limits) -> RunResult:
        builtin = resource_read_tool(pool)
        if builtin.name not in controls:
            controls.register(builtin)
        if add_controls is not None:
            add_controls(controls, run_id)
        request = RunRequest(instruction=job.instruction, run_id=run_id, limits=limits,
                             output_contract=output_contract, seed=job.seed)
        return await run_loop(request, pool=pool, intel=intel, controls=controls, log=log.bind(run_id=run_id))

    return run_job


async def drain_on_signals(drain: trio.Event, log: EventLog) -> None:
    """Set ``drain`` on SIGTERM/SIGINT. Outside the main thread there are no signals to watch."""
    try:
        receiver = trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT)
    except (RuntimeError, ValueError):
        return
    with receiver as signals:
        async for signum in signals:
            log.info("proc.signal", signal=signal.Signals(signum).name, action="drain")
            drain.set()


async def daemon_mode(cfg: Config, log: EventLog, daemon: trio.Nursery, *, drain: trio.Event | None = None,
                      env: dict[str, str] | None = None) -> RunResult:
    """Run ``cfg.mode`` as a daemon until drained (exit 0), stopped by the breaker (1) or budget (7/0)."""
    from agentd.client import open_mcp_pool
    from agentd.intelligence import open_intelligence
    from agentd.secrets import SecretResolver

    if drain is None:
        from agentd.drain import installed_drain

        latch = installed_drain()
        if latch is not None:  # the CLI owns SIGTERM/SIGINT (agentd/drain.py): share its latch
            drain = latch.event
        else:
            drain = trio.Event()
            daemon.start_soon(drain_on_signals, drain, log)
    resolver = SecretResolver(env=env, redactor=log.redactor)
    limits = Limits(max_steps=cfg.max_steps, max_tokens=cfg.max_tokens, deadline=cfg.deadline)
    result: RunResult | None = None
    error: AgentdError | None = None
    log.info("run.start", mode=cfg.mode, servers=[s.name for s in cfg.mcp], daemon=True)
    try:
        async with (
            open_intelligence(list(cfg.intelligence), model=cfg.model, token=cfg.intelligence_token,
                              stream=cfg.stream_intelligence, log=log, secrets=resolver) as intel,
            open_mcp_pool(cfg.mcp, log=log, secrets=resolver, run_id=log.run_id) as pool,
        ):
            runs = DaemonRuns(
                loop_run_job(pool, intel, log, output_contract=cfg.output_contract),
                base_run_id=log.run_id,
                limits=limits,
                log=log,
                budget=LifetimeBudget(cfg.budget_tokens_lifetime),
            )
            ctx = DaemonContext(cfg, runs, log, drain, pool=pool, server_names=[s.name for s in cfg.mcp],
                                open_session=conversation_sessions(runs))
            result = await run_daemon(ctx)
    except BaseExceptionGroup as group:
        error = lone_agentd_error(group)
        if error is None:
            raise
    except AgentdError as exc:
        error = exc
    if result is None:
        assert error is not None
        if isinstance(error, McpConnectError):
            result = RunResult(run_id=log.run_id, status=RunStatus.MCP_FAILED, error=str(error))
        elif isinstance(error, IntelligenceError):
            result = RunResult(run_id=log.run_id, status=RunStatus.INTELLIGENCE_FAILED, error=str(error))
        else:
            raise error  # ConfigError (exit 2): a bad --subscribe, no polling for a server that cannot push
    log.emit("run.end", "info" if result.status is RunStatus.COMPLETED else "warn", status=result.status.value,
             exit_code=int(result.exit_code), daemon=True, steps=result.steps, usage=result.usage.to_json(),
             **({"error": result.error} if result.error else {}))
    return result
