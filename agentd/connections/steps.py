"""Running a manifest: its steps in order, each a run of the agent loop over that step's tools only.

Each later step sees the earlier steps' prompts and outputs as conversation history. A step offers exactly
the tools it names (``alias__tool`` from its bindings, application tools by their own names), nothing
else: no other MCP tool, no ``resource.read``. Budgets: ``maxSteps`` bounds the model calls of each step;
``maxTokens`` and ``deadlineMs`` bound the whole run; ``maxToolCallsPerIteration`` bounds the tool calls
executed per model reply (the excess get an error observation).

Tool activity is reported by :class:`ToolActivity` (the loop's ``ToolObserver``):
``model.tool.requested`` (the model asked), ``model.tool.started`` (admitted, about to run) and
``model.tool.completed`` (how it ended, how long it took). These events carry ids, names, timings and
outcomes, never arguments or results; the values go to the durable transcript only, under its policy.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from agentd.agent.budgets import Limits
from agentd.agent.catalogue import Entry as CatalogueEntry
from agentd.agent.control import ControlContext, ControlResult, ControlTool, ControlToolRegistry
from agentd.agent.ports import Intelligence
from agentd.agent.result import RunResult, RunStatus, RunUsage
from agentd.agent.runner import RunRequest, run_loop
from agentd.client.models import ToolInfo, ToolResult
from agentd.client.pool import McpPool
from agentd.client.tasks import TaskStarted
from agentd.connections.plan import Plan
from agentd.connections.runtime import (
    AgentTool,
    ApplicationToolFailed,
    RuntimeModule,
    ToolExecutionContext,
)
from agentd.connections.runtime import ToolCall as AppToolCall
from agentd.connections.transcript import Entry, Transcript
from agentd.errors import McpError
from agentd.formats.tool_separator import SEPARATOR
from agentd.intelligence import release_idle
from agentd.intelligence.wire import ChatTool, ModelReply, ToolCall, Usage
from agentd.oversight.drain import current_drain
from agentd.telemetry.events import EventLog


@attrs.frozen
class Identity:
    """Who a run acts for: handed to authorize callbacks and application tools."""

    run_id: str
    user: str | None = None
    tenant: str | None = None


@attrs.define(eq=False)
class ToolActivity:
    """The loop's ToolObserver for one manifest step: events, the per-iteration limit, the transcript."""

    log: EventLog
    step_id: str
    max_calls: int | None
    transcript: Transcript | None = None
    iteration: int = 0
    admitted: int = 0
    current: ToolCall | None = None
    _started: dict[str, float] = attrs.field(factory=dict)
    _outcome: dict[str, str] = attrs.field(factory=dict)

    def requested(self, step: int, call: ToolCall) -> None:
        if step != self.iteration:
            self.iteration, self.admitted = step, 0
        self.log.info(
            "model.tool.requested", step_id=self.step_id, iteration=step, call_id=call.id, name=call.name
        )

    def started(self, step: int, call: ToolCall, entry: CatalogueEntry) -> str | None:
        if self.max_calls is not None and self.admitted >= self.max_calls:
            self._outcome[call.id] = "limited"
            return (
                f"limits.maxToolCallsPerIteration ({self.max_calls}) reached: this call was not executed; "
                "ask again in your next reply if it is still needed"
            )
        self.admitted += 1
        self.current = call
        self._started[call.id] = time.perf_counter()
        self.log.info("model.tool.started", step_id=self.step_id, iteration=step, call_id=call.id, name=call.name,
                      connection=entry.server, tool=entry.name)  # fmt: skip
        return None

    def mark(self, call_id: str, outcome: str) -> None:
        self._outcome[call_id] = outcome

    def completed(
        self,
        step: int,
        call: ToolCall,
        entry: CatalogueEntry | None,
        kind: str,
        is_error: bool,
        ms: float,
        observation: str,
    ) -> None:
        began = self._started.pop(call.id, None)
        outcome = self._outcome.pop(call.id, None) or {"result": "error" if is_error else "ok"}.get(
            kind, kind
        )
        duration = round((time.perf_counter() - began) * 1000, 3) if began is not None else 0.0
        self.log.emit(
            "model.tool.completed", "info" if outcome == "ok" else "warn",
            step_id=self.step_id, iteration=step, call_id=call.id, name=call.name,
            connection=entry.server if entry else None, tool=entry.name if entry else None,
            outcome=outcome, is_error=is_error or outcome != "ok", duration_ms=duration,
        )  # fmt: skip
        if self.current is not None and self.current.id == call.id:
            self.current = None
        if self.transcript is not None:
            self.transcript.record(Entry(self.step_id, "tool.result", role="tool", name=call.name, call_id=call.id,
                                         content={"outcome": outcome, "observation": observation},
                                         tool_value=True))  # fmt: skip


def _annotated(tool: ToolInfo) -> ToolInfo:
    """Server annotations shown to the model as information; agentd never authorizes anything by them."""
    if not tool.annotations:
        return tool
    shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(tool.annotations.items()))
    description = (tool.description or "").rstrip()
    return attrs.evolve(tool, description=f"{description}\n(server annotations, informational only: {shown})")


@attrs.define(eq=False)
class StepPool:
    """The MCP pool as one step sees it: only the step's ``alias__tool`` pairs, each call authorized."""

    pool: McpPool
    allowed: frozenset[tuple[str, str]]
    runtime: RuntimeModule
    activity: ToolActivity
    identity: Identity
    plan: Plan

    @property
    def connections(self) -> Mapping[str, Any]:
        aliases = {alias for alias, _ in self.allowed}
        return {name: conn for name, conn in self.pool.connections.items() if name in aliases}

    def tools(self) -> list[ToolInfo]:
        return [_annotated(t) for t in self.pool.tools() if (t.server, t.name) in self.allowed]

    def resources(self) -> list[Any]:
        return []

    def instructions(self) -> dict[str, str]:
        return {k: v for k, v in self.pool.instructions().items() if k in self.connections}

    async def call_tool(
        self, server: str, tool: str, arguments: Mapping[str, Any], *, run_id: str, idempotency_key: str,
        resume_task: str | None = None, on_task: TaskStarted | None = None,
    ) -> ToolResult:
        if (server, tool) not in self.allowed:  # the catalogue only offers allowed tools; belt and braces
            raise McpError(f"tool {server}{SEPARATOR}{tool} is not offered in this step", server=server)
        call = self.activity.current
        bound = self.plan.binding(server)
        denial = await authorize_tool(
            self.runtime, self.identity, call, name=f"{server}{SEPARATOR}{tool}", arguments=arguments,
            connection=bound.binding.ref if bound else server, alias=server, tool=tool,
            mode=bound.mode if bound else None, step_id=self.activity.step_id,
        )  # fmt: skip
        if denial is not None:
            if call is not None:
                self.activity.mark(call.id, "denied")
            return ToolResult([{"type": "text", "text": denial}], True)
        return await self.pool.call_tool(server, tool, arguments, run_id=run_id, idempotency_key=idempotency_key,
                                         resume_task=resume_task, on_task=on_task)

    async def read_resource(self, uri: str, server: str | None = None) -> Any:
        raise McpError("resources are not offered to manifest steps")


async def authorize_tool(
    runtime: RuntimeModule,
    identity: Identity,
    call: ToolCall | None,
    *,
    name: str,
    arguments: Mapping[str, Any],
    connection: str | None,
    alias: str | None,
    tool: str,
    mode: str | None,
    step_id: str,
) -> str | None:
    """The host's verdict on one call: None to proceed, else the observation the model gets."""
    if runtime.authorize_tool is None:
        return None
    decision = await runtime.authorize("tool", {
        "runId": identity.run_id, "user": identity.user, "tenant": identity.tenant, "stepId": step_id,
        "callId": call.id if call else None, "name": name, "connection": connection, "alias": alias,
        "tool": tool, "mode": mode, "input": dict(arguments),
    })  # fmt: skip
    if decision.allowed:
        return None
    return f"denied by host policy: {decision.reason or 'this call is not authorized'}"


def application_controls(
    tools: Sequence[AgentTool],
    runtime: RuntimeModule,
    activity: ToolActivity,
    identity: Identity,
    deadline: float,
) -> list[ControlTool]:
    """Application tools as the loop's control tools, under their own names."""

    def make(tool: AgentTool) -> ControlTool:
        async def handler(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
            current = activity.current
            call_id = current.id if current is not None else f"call-{ctx.step}"
            denial = await authorize_tool(
                runtime, identity, current, name=tool.name, arguments=arguments, connection=None, alias=None,
                tool=tool.name, mode=None, step_id=activity.step_id,
            )  # fmt: skip
            if denial is not None:
                activity.mark(call_id, "denied")
                return ControlResult.text(denial, is_error=True)
            with trio.CancelScope(deadline=deadline) as scope:
                context = ToolExecutionContext(identity.run_id, activity.step_id, identity.user, identity.tenant,
                                               scope, deadline)  # fmt: skip
                outcome = await runtime.execute(AppToolCall(call_id, tool.name, dict(arguments)), context)
            if scope.cancelled_caught:
                activity.mark(call_id, "cancelled")
                return ControlResult.text(f"{tool.name}: cancelled at the run deadline", is_error=True)
            structured = outcome.output if isinstance(outcome.output, dict) and not outcome.is_error else None
            return ControlResult(({"type": "text", "text": outcome.text()},), is_error=outcome.is_error,
                                 structured=structured)  # fmt: skip

        return ControlTool(tool.name, tool.description, tool.input_schema, handler)

    return [make(tool) for tool in tools]


@attrs.define(eq=False)
class RecordingIntelligence:
    """The intelligence, with each reply (text and tool calls with their arguments) sent to the transcript."""

    inner: Intelligence
    transcript: Transcript | None
    step_id: str = ""
    model: str = attrs.field(init=False)
    usage: Usage = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.model = self.inner.model
        self.usage = self.inner.usage

    async def complete(self, messages: list[dict[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        reply = await self.inner.complete(messages, tools)
        self.usage = self.inner.usage
        if self.transcript is not None:
            content: dict[str, Any] = {"content": reply.content}
            if reply.tool_calls:
                content["tool_calls"] = [
                    {"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls
                ]
            self.transcript.record(Entry(self.step_id, "model.reply", role="assistant", content=content))
        return reply

    async def release_idle(self) -> None:
        await release_idle(self.inner)


@attrs.frozen
class StepOutcome:
    step_id: str
    result: RunResult


@attrs.frozen
class ManifestResult:
    run: RunResult
    steps: tuple[StepOutcome, ...]
    error_code: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc = self.run.to_json()
        doc["outputs"] = {s.step_id: s.result.result for s in self.steps}
        if self.run.error is not None:
            doc["error"] = {"code": self.error_code or self.run.status.value, "message": self.run.error}
        return doc


async def run_steps(
    plan: Plan,
    runtime: RuntimeModule,
    *,
    pool: McpPool,
    intel: Intelligence,
    log: EventLog,
    identity: Identity,
    transcript: Transcript | None = None,
    deadline: float | None = None,
) -> ManifestResult:
    """Run every step of the plan's manifest in order; stop at the first step that does not complete.

    ``deadline`` (trio time) is the run's, when the caller started counting earlier (connecting)."""
    manifest = plan.manifest
    limits = manifest.limits
    app_tools = {t.name: t for t in await runtime.list_tools()}
    listed = {(t.server, t.name) for t in pool.tools()}
    for bound in plan.bound:
        if bound.tools is not None and bound.alias in pool.connections:
            missing = [tool for tool in bound.tools if (bound.alias, tool) not in listed]
            if missing:
                log.warn("config.warning", connection=bound.alias, missing_tools=missing,
                         warning="allowlisted tools the server does not list are not offered")  # fmt: skip
    if deadline is None:
        deadline = trio.current_time() + limits.deadline_ms / 1000
    usage = RunUsage()
    iterations = 0
    seed: list[dict[str, Any]] = []
    outcomes: list[StepOutcome] = []
    final: RunResult | None = None
    drain = current_drain()
    for index, step in enumerate(manifest.steps):
        if drain.requested:
            final = RunResult(run_id=identity.run_id, status=RunStatus.CANCELLED, partial=True, steps=iterations,
                              usage=usage, error=f"drained ({drain.reason}) before step {step.id!r}",
                              drained=True)  # fmt: skip
            break
        remaining = deadline - trio.current_time()
        if remaining <= 0:
            final = RunResult(run_id=identity.run_id, status=RunStatus.DEADLINE, partial=True, steps=iterations,
                              usage=usage, error=f"the run deadline passed before step {step.id!r}")  # fmt: skip
            break
        if limits.max_tokens and usage.total_tokens >= limits.max_tokens:
            final = RunResult(run_id=identity.run_id, status=RunStatus.EXHAUSTED_TOKENS, partial=True,
                              steps=iterations, usage=usage,
                              error=f"maxTokens spent before step {step.id!r}")  # fmt: skip
            break
        activity = ToolActivity(log, step.id, limits.max_tool_calls_per_iteration, transcript)
        allowed: set[tuple[str, str]] = set()
        controls = ControlToolRegistry()
        chosen_app: list[AgentTool] = []
        for name in step.tools:
            if name in app_tools:
                chosen_app.append(app_tools[name])
            elif SEPARATOR in name:
                alias, tool = name.split(SEPARATOR, 1)
                allowed.add((alias, tool))
        for control in application_controls(chosen_app, runtime, activity, identity, deadline):
            controls.register(control)
        step_pool = StepPool(pool, frozenset(allowed), runtime, activity, identity, plan)
        request = RunRequest(
            instruction=step.prompt,
            run_id=identity.run_id,
            limits=Limits(
                max_steps=limits.max_steps,
                max_tokens=max(limits.max_tokens - usage.total_tokens, 1) if limits.max_tokens else 0,
                deadline=max(remaining, 1e-3),
            ),
            output_contract=manifest.output if index == len(manifest.steps) - 1 else None,
            seed=tuple(seed),
        )
        if transcript is not None:
            transcript.record(Entry(step.id, "step.start", role="user", content=step.prompt))
        step_log = log.bind(comp="step")
        try:
            result = await run_loop(
                request,
                pool=step_pool,
                intel=RecordingIntelligence(intel, transcript, step.id),
                controls=controls,
                log=step_log,
                observer=activity,
            )
        except ApplicationToolFailed as exc:
            result = RunResult(run_id=identity.run_id, status=RunStatus.FAILED, partial=True, error=str(exc))
        usage = usage.add(result.usage.prompt_tokens, result.usage.completion_tokens)
        iterations += result.steps
        outcomes.append(StepOutcome(step.id, result))
        if transcript is not None:
            transcript.record(Entry(step.id, "step.end", content={"status": result.status.value,
                                                                  "result": result.result}, boundary=True))  # fmt: skip
            await transcript.flush()
        final = attrs.evolve(result, steps=iterations, usage=usage)
        if result.status is not RunStatus.COMPLETED:
            break
        answer = result.result if isinstance(result.result, str) else json.dumps(result.result, default=str)
        seed += [
            {"role": "user", "content": f"[step {step.id}] {step.prompt}"},
            {"role": "assistant", "content": answer if answer is not None else ""},
        ]
    assert final is not None
    return ManifestResult(final, tuple(outcomes))


__all__ = ("Identity", "ManifestResult", "RecordingIntelligence", "StepPool", "ToolActivity", "run_steps")
