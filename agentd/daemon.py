"""``agentd.main(cfg)``: the daemon's root, and ``run_once``, one run with its dependencies injected.

::

    trio.run(agentd.main, cfg)          # a harness, or the CLI after Config.from_argv(argv)

``main`` owns the daemon nursery (the root of the nursery tree in docs/architecture.md) and dispatches on
``cfg.mode`` through :data:`MODES` (``once`` here, ``loop``/``schedule``/``reactive`` in agentd.reactive);
``--serve-mcp`` starts the self-MCP serve task in the same nursery. ``main`` opens ONE root supervisor
around the daemon nursery and hands it to the serve task and to the mode runner, so served spawns and
the agent's own spawns share one chokepoint (caps, ``--max-subagents``, the token ceiling). Once mode
offers its ``subagent.*``/``graph.run`` tools, opens the intelligence and the MCP pool, registers
``resource.read`` and runs the loop once under its budgets.

Nothing here is global: every run builds its own log binding, secret resolver, pool, intelligence and
control registry, so two ``main`` calls in one trio process do not interfere.

Run-level failures end as a :class:`RunResult` (so the CLI always prints one JSON object): a required MCP
server failing its handshake is ``mcp_failed`` (exit 6); an unusable intelligence is
``intelligence_failed`` (exit 4); an unexpected exception is ``crashed`` (exit 1, logged as
``run.failed``). A ``ConfigError`` (exit 2) is not a run outcome: it propagates, as does any other
``AgentdError`` escaping a mode runner (unwrapped from task-group exception groups).
"""

from __future__ import annotations

import os
import secrets as _random
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from agentd import telemetry
from agentd.config.model import Config, McpServerConfig
from agentd.errors import AgentdError, ConfigError, IntelligenceError, McpConnectError
from agentd.events import EventLog, Sink, stream_sink
from agentd.intelligence import open_intelligence
from agentd.intelligence.endpoints import OFFLINE, display
from agentd.intelligence.wire import Usage
from agentd.loop.budgets import Limits
from agentd.loop.builtin import resource_read_tool
from agentd.loop.control import ControlToolRegistry
from agentd.loop.ports import Intelligence, ToolPool
from agentd.loop.result import RunResult, RunStatus
from agentd.loop.runner import RunRequest, UsageHook, run_loop
from agentd.secrets import SecretResolver
from agentd.telemetry import metrics
from agentd.telemetry.health import Health, current_health, use_health
from agentd.telemetry.spans import agent_span, end_agent_span

if TYPE_CHECKING:
    from agentd.supervisor.supervisor import Supervisor
    from agentd.transport.serve import ServeConfig

#: How long the last export of spans may take when the daemon ends.
FINAL_FLUSH_TIMEOUT = 5.0
#: Open connections the metrics listener accepts (scrapers are few).
METRICS_MAX_CONNECTIONS = 16


class ModeRunner(Protocol):
    """Runs the daemon in one mode inside the daemon nursery; ``env`` is where secrets are looked up.

    ``supervisor`` is the daemon's one root supervisor (None in a build without agentd.supervisor): the
    runner offers its ``subagent.*`` tools and reports its runs' usage to it, and never opens another.
    """

    def __call__(
        self, cfg: Config, log: EventLog, daemon: trio.Nursery, *, env: Mapping[str, str] | None,
        supervisor: Supervisor | None = None,
    ) -> Awaitable[RunResult]: ...


def new_run_id() -> str:
    """Time, pid and a random tag: sortable, readable, and distinct for concurrent runs in one process."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}-{_random.token_hex(3)}"


def open_log(cfg: Config, run_id: str) -> EventLog:
    """The process's event log as the config asks for it: JSON lines on stderr."""
    return EventLog(
        sink=stream_sink(sys.stderr),
        level=cfg.log_level,
        log_content=cfg.log_content,
        run_id=run_id,
        comp="agent",
    )


async def main(
    cfg: Config, *, log: EventLog | None = None, env: Mapping[str, str] | None = None
) -> RunResult:
    """Run agentd as configured and return the root run's result (the CLI prints ``result.to_json()``).

    ``log`` replaces the stderr log (a harness capturing events); ``env`` is where ``{{secret:NAME}}``
    references are looked up (default: the process environment).
    """
    run_id = cfg.run_id or new_run_id()
    log = (log or open_log(cfg, run_id)).bind(run_id=run_id)
    runner = MODES.get(cfg.mode)
    if runner is None:
        raise ConfigError(f"--mode {cfg.mode} is not available in this build")
    _start_tracing(cfg, env)
    if cfg.metrics_addr is not None:
        metrics.enable()
    recorder = None
    if cfg.report_file is not None:
        from agentd.telemetry.report import Recorder

        recorder = Recorder(caps={"token_ceiling": cfg.token_ceiling, "max_tokens": cfg.max_tokens,
                                  "max_steps": cfg.max_steps, "max_depth": cfg.max_depth,
                                  "max_children": cfg.max_children, "max_subagents": cfg.max_subagents})
        log = log.bind(sink=_tee(log.sink, recorder.observe))
    with (use_health(Health(mode=cfg.mode)),
          telemetry.remote_parent({"traceparent": cfg.traceparent} if cfg.traceparent else None)):
        try:
            result = await _main(cfg, log, runner, env, run_id)
        finally:
            with trio.CancelScope(shield=True):
                await telemetry.flush(FINAL_FLUSH_TIMEOUT)
            if recorder is not None and cfg.report_file is not None:
                try:
                    recorder.write(cfg.report_file)
                except OSError as exc:
                    log.warn("config.warning", warning=f"--report-file {cfg.report_file}: not written "
                                                       f"({exc.strerror})")
    return result


def _tee(first: Sink, second: Sink) -> Sink:
    def both(line: dict[str, Any]) -> None:
        second(line)
        first(line)

    return both


async def _start_observing(cfg: Config, log: EventLog, daemon: trio.Nursery, env: Mapping[str, str] | None) -> None:
    """The daemon's own observability tasks: heartbeat, health file, metrics listener, span exporter."""
    health = current_health()
    if health is not None:
        daemon.start_soon(health.heartbeat)
        if cfg.health_file is not None:
            daemon.start_soon(health.write_file, cfg.health_file)
    if telemetry.enabled():
        daemon.start_soon(telemetry.run_exporter)
    if cfg.metrics_addr is not None:
        from agentd.transport.observe_app import serve_metrics

        resolver = SecretResolver(env=env, redactor=log.redactor)
        bearer = resolver.resolve(cfg.serve_bearer) if cfg.serve_bearer else None
        await daemon.start(serve_metrics, metrics_serve_config(cfg, bearer), log)


def metrics_serve_config(cfg: Config, bearer: str | None) -> ServeConfig:
    """``--metrics-addr`` as a listener: TLS (and mTLS) with the self-MCP's files when they are given."""
    from agentd.transport.serve import ServeConfig

    assert cfg.metrics_addr is not None
    tls = cfg.serve_cert is not None and cfg.serve_key is not None
    return ServeConfig(
        url=f"{'https' if tls else 'http'}://{cfg.metrics_addr}/metrics",
        cert=Path(cfg.serve_cert) if tls and cfg.serve_cert else None,
        key=Path(cfg.serve_key) if tls and cfg.serve_key else None,
        client_ca=Path(cfg.serve_client_ca) if tls and cfg.serve_client_ca else None,
        bearer=bearer,
        max_connections=METRICS_MAX_CONNECTIONS,
        max_per_client=METRICS_MAX_CONNECTIONS,
    )


def _start_tracing(cfg: Config, env: Mapping[str, str] | None) -> None:
    """``--otel``: trace this process (OTEL_SDK_DISABLED=true wins); settings from the OTEL_* variables."""
    if not cfg.otel:
        return
    from agentd.telemetry.settings import OtelSettings, sdk_disabled

    environ = os.environ if env is None else env
    if not sdk_disabled(environ):
        telemetry.enable(OtelSettings.from_env(environ, log_content=cfg.log_content))


async def _main(
    cfg: Config, log: EventLog, runner: ModeRunner, env: Mapping[str, str] | None, run_id: str
) -> RunResult:
    escaped: AgentdError | None = None
    # ONE root supervisor per daemon, opened before and closed after the daemon nursery: the served
    # self-MCP (Management origin) and the agent's own runs (Stdio origin) spawn through the same
    # chokepoint, so the caps are counted once (the token ceiling is per run tree: docs/supervisor.md).
    async with _root_supervisor(cfg, log, env) as supervisor, trio.open_nursery() as daemon:
        await _start_observing(cfg, log, daemon, env)
        served = await _start_serving(cfg, log, daemon, env, supervisor)
        if (health := current_health()) is not None:
            health.started = True
        try:
            if served is not None and cfg.instruction is None:
                result = RunResult(run_id=run_id, status=RunStatus.COMPLETED)  # a pure worker: no own run
            else:
                result = await runner(cfg, log, daemon, env=env, supervisor=supervisor)
        except Exception as exc:
            leaf = _leaf(exc)
            if isinstance(leaf, AgentdError):
                # Ours, even from inside a task group (a ConfigError is still exit 2): re-raised as itself
                # once the daemon nursery is closed, so the CLI maps it to its exit code.
                escaped = leaf
                result = RunResult(run_id=run_id, status=RunStatus.FAILED, error=str(leaf))
            else:  # a bug: report it as a run outcome so stdout still carries one object
                error = f"{type(leaf).__name__}: {leaf}"
                trace = "".join(traceback.format_exception(leaf)[-12:])
                log.error("run.failed", error=error, traceback=trace)
                result = RunResult(run_id=run_id, status=RunStatus.CRASHED, error=error)
        if served is not None and escaped is None:
            # While serving, the daemon stays up until signalled, whatever its mode; then the serve task
            # drains (listener, then served runs within --drain-timeout) and ends on its own.
            await served.wait()
        # Services other parts start in the daemon nursery (serve, watchers) end with the root run in once mode.
        daemon.cancel_scope.cancel()
    if escaped is not None:
        raise escaped
    return result


@asynccontextmanager
async def _root_supervisor(
    cfg: Config, log: EventLog, env: Mapping[str, str] | None
) -> AsyncIterator[Supervisor | None]:
    """The daemon's root supervisor (children start lazily: opening it costs nothing until a spawn)."""
    try:
        from agentd.supervisor.wiring import open_root_supervisor
    except ModuleNotFoundError:  # a build without the supervisor: the loop alone
        yield None
        return
    environ = os.environ if env is None else env
    async with open_root_supervisor(cfg, log=log, env=environ, run_id=log.run_id) as supervisor:
        yield supervisor


async def _start_serving(
    cfg: Config, log: EventLog, daemon: trio.Nursery, env: Mapping[str, str] | None = None,
    supervisor: Supervisor | None = None,
) -> trio.Event | None:
    """Start ``--serve-mcp`` in the daemon nursery (agentd/selfmcp/serving.py); the event is set when it ended."""
    if cfg.serve_mcp is None:
        return None
    from agentd.selfmcp.serving import serve_for_daemon

    ended = trio.Event()

    async def serve(task_status: trio.TaskStatus[object]) -> None:
        try:
            await serve_for_daemon(cfg, log, env=env, supervisor=supervisor, task_status=task_status)
        finally:
            ended.set()

    await daemon.start(serve)
    return ended


async def _once(
    cfg: Config, log: EventLog, daemon: trio.Nursery, *, env: Mapping[str, str] | None,
    supervisor: Supervisor | None = None,
) -> RunResult:
    """The root run: with the root supervisor's ``subagent.*``/``graph.run`` tools while depth remains.

    Without a ``supervisor`` handed in (a library caller of the runner) one is opened for this run.
    When the run ends its own subagents (``0.*``) are cancelled, as a finishing parent's are; served
    runs (``served.N``) on the same supervisor keep running until the daemon drains.
    """
    if supervisor is None:
        async with _root_supervisor(cfg, log, env) as opened:
            if opened is None:
                return await run_config(cfg, run_id=log.run_id, log=log, env=env)
            return await _once(cfg, log, daemon, env=env, supervisor=opened)
    from agentd.supervisor.messages import Usage as UsageFrame
    from agentd.supervisor.supervisor import Caller, Origin
    from agentd.supervisor.tools import register_subagent_tools

    root = supervisor
    controls = ControlToolRegistry()
    if cfg.max_depth > 0:
        register_subagent_tools(controls, root, Caller(Origin.STDIO, root.handle))

    async def on_usage(usage: Usage) -> None:
        # The root's own tokens count against the tree ceiling like every descendant's.
        frame = UsageFrame(usage.prompt_tokens, usage.completion_tokens)
        await root.authority.report_usage(root.handle, frame)

    try:
        return await run_config(cfg, run_id=log.run_id, log=log, env=env, controls=controls, on_usage=on_usage)
    finally:
        root.cancel_own_subtree("parent ended")


async def _daemon_mode(
    cfg: Config, log: EventLog, daemon: trio.Nursery, *, env: Mapping[str, str] | None,
    supervisor: Supervisor | None = None,
) -> RunResult:
    from agentd.reactive.entry import daemon_mode

    return await daemon_mode(cfg, log, daemon, env=None if env is None else dict(env), supervisor=supervisor)


#: ``cfg.mode`` -> its runner. Daemon modes live in agentd.reactive (imported when used).
MODES: dict[str, ModeRunner] = {
    "once": _once,
    "loop": _daemon_mode,
    "schedule": _daemon_mode,
    "reactive": _daemon_mode,
}


def limits_of(cfg: Config) -> Limits:
    return Limits(max_steps=cfg.max_steps, max_tokens=cfg.max_tokens, deadline=cfg.deadline)


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
) -> RunResult:
    """One run described by ``cfg`` (each keyword overrides its part): open the intelligence and the MCP
    pool, register the built-in control tools, run the loop. Emits ``run.start`` and ``run.end``.

    The supervisor's child entry calls this with the spawn payload's instruction, server subset, limits
    and context seed; the reactive modes call it once per wake.
    """
    from agentd.client import open_mcp_pool

    log = log.bind(run_id=run_id)
    request = RunRequest(
        instruction=instruction if instruction is not None else (cfg.instruction or ""),
        run_id=run_id,
        limits=limits or limits_of(cfg),
        output_contract=output_contract if output_contract is not None else cfg.output_contract,
        seed=tuple(seed),
    )
    if not request.instruction.strip():
        raise ConfigError("an instruction is required (--instruction or --instruction-file)")
    declared = tuple(cfg.mcp if servers is None else servers)
    log.info(
        "run.start",
        mode=cfg.mode,
        instruction=log.content(request.instruction),
        servers=[s.name for s in declared],
        intelligence=[url if url == OFFLINE else display(url) for url in cfg.intelligence],
        model=cfg.model,
        max_steps=request.limits.max_steps,
        max_tokens=request.limits.max_tokens,
        deadline=request.limits.deadline,
    )
    resolver = SecretResolver(env=env, redactor=log.redactor)
    failure: tuple[RunStatus, str] | None = None
    result: RunResult | None = None
    with agent_span(log.agent_path, run_id, cfg.model, request.instruction) as span:
        try:
            async with (
                open_intelligence(
                    list(cfg.intelligence),
                    model=cfg.model,
                    token=cfg.intelligence_token,
                    stream=cfg.stream_intelligence,
                    log=log,
                    secrets=resolver,
                ) as intel,
                open_mcp_pool(declared, log=log, secrets=resolver, run_id=run_id) as pool,
            ):
                result = await run_once(
                    request, pool=pool, intel=intel, log=log, controls=controls, on_usage=on_usage
                )
        except* trio.Cancelled:
            # Cancelled from outside (a forced drain, a parent's kill ladder): say so, then let it unwind.
            log.warn("run.cancelled", reason="the run was cancelled from outside")
            raise
        except* McpConnectError as group:
            failure = (RunStatus.MCP_FAILED, _first_message(group))
        except* IntelligenceError as group:
            failure = (RunStatus.INTELLIGENCE_FAILED, _first_message(group))
        if result is None:
            assert failure is not None
            status, error = failure
            result = RunResult(run_id=run_id, status=status, error=error)
        metrics.run_ended(result.status.value)
        end_agent_span(span, result.status.value, result.steps, result.usage.prompt_tokens,
                       result.usage.completion_tokens)
    log.emit(
        "run.end",
        "info" if result.status is RunStatus.COMPLETED else "warn",
        status=result.status.value,
        exit_code=int(result.exit_code),
        partial=result.partial,
        steps=result.steps,
        usage=result.usage.to_json(),
        **({"error": result.error} if result.error else {}),
    )
    return result


async def run_once(
    request: RunRequest,
    *,
    pool: ToolPool,
    intel: Intelligence,
    log: EventLog,
    controls: ControlToolRegistry | None = None,
    on_usage: UsageHook | None = None,
) -> RunResult:
    """Run the loop once with everything injected: the pool and intelligence are already open.

    Registers ``resource.read`` unless the registry already has one; the caller's other control tools
    (``subagent.*``, ``subscribe``, …) are offered as they are.
    """
    registry = controls if controls is not None else ControlToolRegistry()
    builtin = resource_read_tool(pool)
    if builtin.name not in registry:
        registry.register(builtin)
    return await run_loop(request, pool=pool, intel=intel, controls=registry, log=log, on_usage=on_usage)


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (possibly nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _first_message(group: BaseExceptionGroup[Any]) -> str:
    return str(_leaf(group))
