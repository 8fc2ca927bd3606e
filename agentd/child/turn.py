"""The real turn runner: one agent-loop run per turn, configured entirely from the run payload.

The child's Config, server subset and secrets come from the payload; its ``subagent.*`` and ``graph.run``
tools are bound to the child's own nested supervisor (whose authority is the root). Usage is forwarded
to the parent as it happens (the tree's token ceiling counts every descendant); a warm session's
earlier turns are seeded into the next turn so the conversation continues.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from agentd import telemetry as tracing
from agentd.child.context import KEEPS_RUN_OPEN, ChildContext
from agentd.supervisor.messages import Result, RunPayload

if TYPE_CHECKING:
    from agentd.config.model import Config
    from agentd.journal.store import JournalStore
    from agentd.telemetry.events import Redactor

#: How long a child may spend exporting its spans at the end of a turn (the parent waits for the result).
TURN_FLUSH_TIMEOUT = 3.0


async def loop_turn(ctx: ChildContext, message: str) -> Result:
    from agentd.agent.budgets import Limits
    from agentd.agent.control import ControlToolRegistry
    from agentd.agent.distill import structured_answer
    from agentd.run import is_cancellation, run_config
    from agentd.supervisor.supervisor import Caller, Origin
    from agentd.supervisor.tools import register_subagent_tools
    from agentd.supervisor.wiring import config_from_wire
    from agentd.telemetry.events import EventLog, stream_sink

    payload = ctx.payload
    cfg = config_from_wire(payload.config)
    telemetry = payload.telemetry
    log = EventLog(sink=stream_sink(sys.stderr), level=str(telemetry.get("log_level", "info")),
                   log_content=bool(telemetry.get("log_content", False)), run_id=str(telemetry.get("run_id", "")),
                   agent_path=payload.handle, comp="agent")
    for value in payload.secrets.values():
        log.redactor.add(value)
    registry = ControlToolRegistry()
    register_subagent_tools(registry, ctx.supervisor, Caller(Origin.STDIO, payload.handle))

    async def on_usage(usage: Any, cost: int | None) -> None:
        await ctx.usage(int(usage.prompt_tokens), int(usage.completion_tokens), int(usage.estimated_tokens), cost)

    seed: list[dict[str, Any]] = []
    if payload.context:
        seed.append({"role": "user", "content": "Results of the steps this task depends on:\n"
                     + json.dumps(payload.context, ensure_ascii=False, default=str)})
    seed.extend(ctx.history)
    otel = telemetry.get("otel")
    if isinstance(otel, dict):  # the root traces: so does every descendant, into the same trace
        from agentd.telemetry.settings import OtelSettings

        settings = OtelSettings.from_wire(otel)
        for value in settings.headers.values():
            log.redactor.add(value)
        tracing.enable(settings)

    try:
        with tracing.remote_parent(telemetry), _credentials(ctx, cfg):
            async with _journal(payload, log.redactor) as journal:
                run_id = _run_id(payload, log.run_id)
                try:
                    result = await run_config(
                        cfg, run_id=run_id, log=log,
                        env=payload.secrets, instruction=message, output_contract=payload.output_contract,
                        servers=cfg.mcp, limits=Limits(max_steps=cfg.budgets.max_steps, max_tokens=cfg.budgets.max_tokens,
                                                       deadline=cfg.budgets.deadline),
                        controls=registry, on_usage=on_usage, seed=seed, journal=journal,
                        parent=payload.handle.rpartition(".")[0] or None if journal is not None else None,
                        new_run=journal is not None and payload.journal is not None and payload.journal.get("new") is True,
                        parent_commits_end=journal is not None and payload.journal is not None
                        and payload.journal.get("parent") is True,
                        settings=payload.config,  # the digest of what it was started with: its wire config
                    )
                except BaseException as exc:
                    reason = ctx.cancelled
                    if journal is not None and reason is not None and reason not in KEEPS_RUN_OPEN \
                            and is_cancellation(exc):
                        await _journal_cancelled(journal, run_id, reason)
                    raise
    finally:
        with trio.CancelScope(shield=True):
            await tracing.flush(TURN_FLUSH_TIMEOUT)
    ctx.history.extend([{"role": "user", "content": message},
                        {"role": "assistant", "content": json.dumps(result.result, default=str)}])
    # A child that answered with JSON hands its parent the value, not a string holding it.
    return Result(status=str(result.status.value), partial=bool(result.partial),
                  result=structured_answer(result.result))


def _credentials(ctx: ChildContext, cfg: Config) -> contextlib.AbstractContextManager[object]:
    """The child's credential source for OAuth / client-credentials connections (agentd.connections.source),
    built on the first turn that needs one from the payload's secrets and kept for the session's later turns
    (their tokens are reused); a child without such a connection imports nothing for it."""
    if ctx.credentials is None:
        if not any(server.credentials is not None for server in cfg.mcp):
            return contextlib.nullcontext()
        from agentd.connections.source import HostCredentials

        ctx.credentials = HostCredentials(ctx.payload.secrets, cfg.egress.policy(), cfg.runtime_module)
    from agentd.client.credentials import use_credentials

    return use_credentials(ctx.credentials)


async def _journal_cancelled(journal: JournalStore, run_id: str, reason: str) -> None:
    """End a journaled run that was cancelled for good (not resumed later): ``run.ended`` with ``cancelled``,
    shielded and bounded (the turn is being cancelled)."""
    from agentd.journal.errors import JournalError
    from agentd.journal.recorder import RunRecorder, rebuild

    with trio.CancelScope(shield=True), trio.move_on_after(TURN_FLUSH_TIMEOUT):
        try:
            prior = await journal.read_run(run_id)
            if prior is not None and rebuild(prior).ended is None:
                await RunRecorder(journal, run_id).ended("cancelled", {"cancelled": reason}, reason)
        except JournalError:
            pass  # left unfinished: a resumed parent's spawn would continue it


def _run_id(payload: RunPayload, tree: str) -> str:
    """The run id of this turn: the one the parent derived for the child's journal, else the tree's run and
    the handle (a warm session's turns, an unjournaled tree)."""
    if payload.journal is not None and isinstance(payload.journal.get("run_id"), str):
        return str(payload.journal["run_id"])
    return f"{tree}/{payload.handle}" if tree else payload.handle


@asynccontextmanager
async def _journal(payload: RunPayload, redactor: Redactor) -> AsyncIterator[JournalStore | None]:
    """The tree's journal, when the parent asked this child to journal its run (docs/durability.md): the same
    SQLite file as the root's (or, in a cluster, the same database, fenced by the tree's work item), its own connection (WAL: writers of several processes take turns, each waits
    up to the busy timeout), with the run's known secret values redacted from what it writes, as the root's.
    Imported only then: an unjournaled child never loads sqlite3."""
    where = payload.journal
    if where is None or not isinstance(where.get("run_id"), str) or not (
            isinstance(where.get("state_dir"), str) or isinstance(where.get("cluster"), dict)):
        yield None
        return
    from agentd.errors import ConfigError
    from agentd.journal.errors import JournalError

    opened = False
    try:
        async with _open(where, redactor) as journal:
            opened = True
            yield journal
    except JournalError as exc:
        if opened:  # a write failure of the run: its own outcome
            raise
        raise ConfigError(f"the tree's journal: {exc}") from None


def _open(where: dict[str, Any], redactor: Redactor) -> contextlib.AbstractAsyncContextManager[JournalStore]:
    """The tree's SQLite file, or in a cluster its shared database with every commit fenced by the lease of the
    work item the tree runs (agentd.cluster.store.open_fenced_journal: psycopg only for such a child)."""
    if isinstance(where.get("cluster"), dict):
        from agentd.cluster.store import open_fenced_journal

        return open_fenced_journal(where["cluster"], redactor=redactor)
    from agentd.journal.sqlite import open_journal

    return open_journal(str(where["state_dir"]), redactor=redactor, checked=True)  # the root opened it first
