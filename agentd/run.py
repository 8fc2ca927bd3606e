"""One run, composed in one place: what it opens, how it ends, and what it says about itself.

Every run of agentd goes through here: the daemon's once run and a subagent's turn (:func:`run_config`), each
wake of the loop, schedule and reactive modes (:func:`run_with`, on the daemon's long-lived context), and
``agentd run``'s manifest steps. So they all

- open the same way: :func:`open_run` opens the intelligence client and the MCP pool inside the run's
  deadline (a server that accepts and never answers spends the run's time, not more);
- end by the same rule: :func:`outcome_of` turns whatever escaped (trio wraps it in exception groups) into
  one :class:`RunResult`, so a failure has the same exit code whichever layer sees it;
- say ``run.start`` and ``run.end`` with the same fields (:func:`started`, :func:`ended`).

Decisions are data: :func:`agentd.errors.flatten` names the one exception a group stands for,
:func:`outcome_of` maps it to a status. Cancellation and configuration errors are not run outcomes; they propagate.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from agentd.a2a.client import A2aPeers, open_a2a_peers
from agentd.client import open_mcp_pool
from agentd.client.pool import McpPool
from agentd.config.model import Config, McpServerConfig
from agentd.errors import AgentdError, ConfigError, ExitCode, flatten, leaves
from agentd.events import EventLog
from agentd.intelligence import open_intelligence
from agentd.intelligence.endpoints import OFFLINE, display
from agentd.loop.a2a import register_a2a_tools
from agentd.loop.budgets import Limits
from agentd.loop.builtin import resource_read_tool
from agentd.loop.control import ControlToolRegistry
from agentd.loop.ports import Intelligence, ToolPool
from agentd.loop.result import RunResult, RunStatus
from agentd.loop.runner import RunRequest, UsageHook, run_loop
from agentd.secrets import SecretResolver
from agentd.telemetry import metrics
from agentd.telemetry.spans import agent_span, end_agent_span


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
        return cls(tuple(cfg.intelligence), cfg.model, cfg.intelligence_token, cfg.stream_intelligence)

    def shown(self) -> list[str]:
        """The endpoints as events may show them (no credentials in a URL)."""
        return [url if url == OFFLINE else display(url) for url in self.endpoints]


@attrs.frozen
class Opened:
    """What :func:`open_run` opened, and when the run's time ends (trio clock; ``inf`` for none)."""

    intel: Intelligence
    pool: McpPool
    #: The connected A2A peers (docs/a2a.md); empty when none are declared.
    peers: A2aPeers
    end: float = math.inf

    def remaining(self) -> float:
        return max(self.end - trio.current_time(), 1e-3) if self.end != math.inf else math.inf


def limits_of(cfg: Config) -> Limits:
    return Limits(max_steps=cfg.max_steps, max_tokens=cfg.max_tokens, deadline=cfg.deadline)


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
) -> AsyncIterator[Opened]:
    """Open the intelligence, the MCP pool and the A2A peers for one run (or one daemon's life) and hold them.

    ``deadline`` (seconds from now) bounds the opening too; once both are open the block owns the rest of the
    time (``Opened.remaining()``), and this scope stops binding.

    Raises:
        ConnectDeadline: the deadline passed while opening (exit 7, status ``deadline``).
        McpConnectError: a required server failed its handshake (exit 6); A2aConnectError: a required A2A
            peer is unreachable or its card is invalid (exit 6).
        IntelligenceError: the gateway configuration is unusable (exit 4).
    """
    end = trio.current_time() + deadline
    connected = False
    try:
        with trio.CancelScope(deadline=end) as opening:
            async with (
                open_intelligence(list(gateway.endpoints), model=gateway.model, token=gateway.token,
                                  stream=gateway.stream, log=log, secrets=secrets) as intel,
                open_mcp_pool(servers, log=log, secrets=secrets, run_id=run_id) as pool,
                open_a2a_peers(a2a_peers, log=log, secrets=secrets) as peers,
            ):
                opening.deadline = math.inf
                connected = True
                yield Opened(intel, pool, peers, end)
    except BaseException:
        if connected or not opening.cancel_called:
            raise
    if not connected:  # cut short by the deadline (whatever the half-open connections raised meanwhile)
        raise ConnectDeadline(f"the run deadline ({deadline:g} s) passed while connecting")


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
        usage=result.usage.to_json(),
        **fields,
        **({"error": result.error} if result.error else {}),
    )


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
) -> RunResult:
    """Run the loop once with everything already open (a wake uses the daemon's pool and intelligence).

    Registers ``resource.read`` unless the registry already has one, and the ``a2a.*`` tools when ``peers``
    has a connected peer; the caller's other control tools (``subagent.*``, ``subscribe``, …) are offered as
    they are.
    """
    registry = controls if controls is not None else ControlToolRegistry()
    builtin = resource_read_tool(pool)
    if builtin.name not in registry:
        registry.register(builtin)
    if peers is not None:
        register_a2a_tools(registry, peers)
    return await run_loop(request, pool=pool, intel=intel, controls=registry, log=log, on_usage=on_usage)


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
    """One whole run described by ``cfg`` (each keyword overrides its part): open, run the loop, end.

    The daemon's once run calls this; so does a subagent's turn, with the spawn payload's instruction, server
    subset, limits and context seed. Emits ``run.start`` and ``run.end``.
    """
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
    gateway = Gateway.of(cfg)
    # The run's span covers opening (handshakes, listings) as well as the loop: one span per run.
    with agent_span(log.agent_path, run_id, cfg.model, request.instruction) as span:
        started(log, mode=cfg.mode, servers=[s.name for s in declared],
                instruction=log.content(request.instruction), intelligence=gateway.shown(), model=cfg.model,
                max_steps=request.limits.max_steps, max_tokens=request.limits.max_tokens,
                deadline=request.limits.deadline)
        resolver = SecretResolver(env=env, redactor=log.redactor)
        try:
            async with open_run(gateway, declared, log=log, secrets=resolver, run_id=run_id,
                                deadline=request.limits.deadline, a2a_peers=cfg.a2a_peers) as opened:
                # The loop owns what is left of the deadline (its own move_on_after keeps the best result so far).
                rest = attrs.evolve(request, limits=attrs.evolve(request.limits, deadline=opened.remaining()))
                result = await run_with(rest, pool=opened.pool, intel=opened.intel, log=log, controls=controls,
                                        on_usage=on_usage, peers=opened.peers)
        except BaseException as exc:
            reraise_if_not_an_outcome(exc, log)
            if isinstance(flatten(exc), ConnectDeadline):
                log.warn("loop.budget", budget=RunStatus.DEADLINE.value, steps=0,
                         max_steps=request.limits.max_steps, tokens=0, max_tokens=request.limits.max_tokens,
                         deadline=request.limits.deadline)
            result = outcome_of(exc, run_id=run_id, log=log)
        metrics.run_ended(result.status.value)
        end_agent_span(span, result.status.value, result.steps, result.usage.prompt_tokens,
                       result.usage.completion_tokens)
        ended(log, result)
    return result


__all__ = [
    "ConnectDeadline",
    "Gateway",
    "Opened",
    "ended",
    "is_cancellation",
    "limits_of",
    "open_run",
    "outcome_of",
    "reraise_if_not_an_outcome",
    "run_config",
    "run_with",
    "started",
]
