"""The real turn runner: one agent-loop run per turn, configured entirely from the run payload.

The child's Config, server subset and secrets come from the payload; its ``subagent.*`` and ``graph.run``
tools are bound to the child's own nested supervisor (whose authority is the root). Usage is forwarded
to the parent as it happens (the tree's token ceiling counts every descendant); a warm session's
earlier turns are seeded into the next turn so the conversation continues.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import trio

from agentd import telemetry as tracing
from agentd.child.context import ChildContext
from agentd.supervisor.messages import Result

#: How long a child may spend exporting its spans at the end of a turn (the parent waits for the result).
TURN_FLUSH_TIMEOUT = 3.0


async def loop_turn(ctx: ChildContext, message: str) -> Result:
    from agentd.events import EventLog, stream_sink
    from agentd.loop.budgets import Limits
    from agentd.loop.control import ControlToolRegistry
    from agentd.loop.distill import structured_answer
    from agentd.run import run_config
    from agentd.supervisor.supervisor import Caller, Origin
    from agentd.supervisor.tools import register_subagent_tools
    from agentd.supervisor.wiring import config_from_wire

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

    async def on_usage(usage: Any) -> None:
        await ctx.usage(int(usage.prompt_tokens), int(usage.completion_tokens), int(usage.estimated_tokens))

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
        with tracing.remote_parent(telemetry):
            result = await run_config(
                cfg, run_id=f"{log.run_id}/{payload.handle}" if log.run_id else payload.handle, log=log,
                env=payload.secrets, instruction=message, output_contract=payload.output_contract,
                servers=cfg.mcp, limits=Limits(max_steps=cfg.max_steps, max_tokens=cfg.max_tokens,
                                               deadline=cfg.deadline),
                controls=registry, on_usage=on_usage, seed=seed,
            )
    finally:
        with trio.CancelScope(shield=True):
            await tracing.flush(TURN_FLUSH_TIMEOUT)
    ctx.history.extend([{"role": "user", "content": message},
                        {"role": "assistant", "content": json.dumps(result.result, default=str)}])
    # A child that answered with JSON hands its parent the value, not a string holding it.
    return Result(status=str(result.status.value), partial=bool(result.partial),
                  result=structured_answer(result.result))
