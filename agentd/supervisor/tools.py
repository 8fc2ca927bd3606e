"""The in-loop control tools: ``subagent.spawn``, ``.send``, ``.status``, ``.await``, ``.cancel``.

Registered through the loop's :class:`~agentd.agent.control.ControlToolRegistry`; every handler goes
through the one :class:`Supervisor` chokepoint with the run's own :class:`Caller` (origin STDIO, the
agent's handle), so a model can only reach subagents of its own subtree. Cap and scope refusals are
``isError`` observations the model can adapt to; malformed arguments never get here (the loop validates
against ``input_schema`` and answers with a protocol error).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from agentd.agent.control import ChildJournal, ControlContext, ControlResult, ControlTool, ControlToolRegistry
from agentd.supervisor.caps import Refusal
from agentd.supervisor.graph import child_run, graph_tool, number_after_journaled
from agentd.supervisor.supervisor import Caller, SpawnRequest, Supervisor

if TYPE_CHECKING:  # an outcome is a view or a Refusal: the node module loads with the first spawn
    from agentd.supervisor.node import RunView

_HANDLE = {"type": "string", "minLength": 1, "description": "A handle returned by subagent.spawn."}

SPAWN_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "instruction": {"type": "string", "minLength": 1, "description": "The task for the subagent."},
        "output_contract": {"type": "string", "description": "Exactly what the subagent must return."},
        "tool_scope": {"type": "array", "items": {"type": "string"},
                       "description": "A subset of your MCP server (and A2A peer) names (default: all of yours)."},
        "async": {"type": "boolean", "default": False, "description": "Return a handle at once."},
        "warm": {"type": "boolean", "default": False,
                 "description": "Keep the subagent alive as a session driven by subagent.send."},
        "token_budget": {"type": "integer", "minimum": 1,
                         "description": "Tokens reserved for the subagent and its own subagents out of what "
                                        "you have left (default: half of it); unused tokens come back."},
        "model": {"type": "string", "minLength": 1,
                  "description": "The model the subagent calls, one of those allowed (default: yours)."},
    },
    "required": ["instruction"],
    "additionalProperties": False,
}
SEND_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"handle": _HANDLE, "message": {"type": "string", "minLength": 1}},
    "required": ["handle", "message"],
    "additionalProperties": False,
}
HANDLE_SCHEMA: Mapping[str, Any] = {
    "type": "object", "properties": {"handle": _HANDLE}, "required": ["handle"], "additionalProperties": False,
}
CANCEL_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"handle": _HANDLE, "reason": {"type": "string"}},
    "required": ["handle"],
    "additionalProperties": False,
}


def reply(outcome: RunView | Refusal) -> ControlResult:
    """A view as a tool result (JSON text plus ``structuredContent``), or a refusal as ``isError``."""
    if isinstance(outcome, Refusal):
        return ControlResult.text(outcome.message, is_error=True)
    structured = outcome.structured()
    return ControlResult(
        ({"type": "text", "text": json.dumps(structured, ensure_ascii=False, default=str)},),
        structured=structured,
    )


def spawn_request(arguments: Mapping[str, Any], journal_run: str | None = None, journal_new: bool = False
                  ) -> SpawnRequest:
    scope = arguments.get("tool_scope")
    warm = bool(arguments.get("warm", False))
    return SpawnRequest(
        instruction=str(arguments["instruction"]),
        output_contract=arguments.get("output_contract"),
        tool_scope=None if scope is None else tuple(str(s) for s in scope),
        async_=bool(arguments.get("async", False)),
        warm=warm,
        token_budget=int(arguments["token_budget"]) if arguments.get("token_budget") is not None else None,
        journal_run=None if warm else journal_run,
        journal_new=journal_new and not warm,
        journal_parent=journal_run is not None and not warm,  # a run's spawn: its result is that run's to commit
        model=str(arguments["model"]) if arguments.get("model") is not None else None,
    )


def resumes(arguments: Mapping[str, Any]) -> bool:
    """A spawn lost in a crash is made again: its child resumes its journaled run (or replays its result). A
    synchronous one answers its result; an async one its handle (the same child the earlier process started,
    if its spawn was journaled: :func:`subagent_tools`). A warm one is not: a session is not journaled."""
    return not arguments.get("warm")


async def journaled(ctx: ControlContext, outcome: RunView | Refusal) -> RunView | Refusal:
    """Journal a child's end the first time the run sees it (``--state-dir``); the outcome unchanged."""
    if ctx.journal is not None and not isinstance(outcome, Refusal) and outcome.done:
        await ctx.journal.child_ended(outcome.handle, outcome.status, outcome.result)
    return outcome


def answer(ctx: ControlContext, handle: str, outcome: RunView | Refusal) -> ControlResult:
    """:func:`reply`, except that a handle an earlier process of this (resumed) run left running answers how it
    ended for the run (``lost``; a warm session ``interrupted``, with the reason) instead of being unknown."""
    ended = ctx.journal.earlier_end(handle) if ctx.journal is not None and isinstance(outcome, Refusal) else None
    if ended is None:
        return reply(outcome)
    structured = {"handle": handle, "status": ended[0], "done": True, "partial": False, "result": ended[1]}
    return ControlResult(({"type": "text", "text": json.dumps(structured, ensure_ascii=False)},),
                         structured=structured)



async def resume_children(supervisor: Supervisor, caller: Caller, journal: ChildJournal) -> None:
    """A resumed run's async children continue: each is spawned again under the handle the model holds, with
    the arguments it was spawned with, and resumes its journaled run (or replays its recorded end), so a
    later ``subagent.status``/``await`` of that handle answers as if nothing had happened. One that cannot be
    spawned (draining, a cap) is recorded ``lost`` with the refusal."""
    number_after_journaled(supervisor, caller, journal)
    for child in journal.resumable_children():
        request = attrs.evolve(spawn_request(child.arguments, child.run), async_=True, handle=child.handle)
        outcome = await supervisor.spawn(caller, request)
        if isinstance(outcome, Refusal):
            await journal.lost([child.handle], reason=outcome.message)
        supervisor.log.info("subagent.resumed", handle=child.handle, run=child.run,
                            status="lost" if isinstance(outcome, Refusal) else outcome.status)


def subagent_tools(supervisor: Supervisor, caller: Caller) -> list[ControlTool]:
    async def spawn(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        request = spawn_request(arguments, child_run(ctx), ctx.journal is not None and ctx.journal.new)
        number_after_journaled(supervisor, caller, ctx.journal)
        earlier = (ctx.journal.child_of_run(request.journal_run)
                   if ctx.journal is not None and request.journal_run is not None else None)
        if earlier is not None and request.async_:
            # This async spawn was made again after a crash and the earlier process had started its child:
            # the answer is that child's handle (resumed with the run, or resumed now to replay its end).
            view = supervisor.status(caller, earlier)
            if not isinstance(view, Refusal):
                return reply(await journaled(ctx, view))
            request = attrs.evolve(request, handle=earlier)
        outcome = await supervisor.spawn(caller, request)
        if ctx.journal is not None and not isinstance(outcome, Refusal) and request.handle is None:
            await ctx.journal.spawned(ctx.step, outcome.handle, request.instruction, request.token_budget,
                                      request.journal_run, request.warm,
                                      ended=(outcome.status, outcome.result) if outcome.done else None)
        return reply(await journaled(ctx, outcome))

    async def send(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        handle = str(arguments["handle"])
        outcome = await supervisor.send(caller, handle, str(arguments["message"]))
        return answer(ctx, handle, await journaled(ctx, outcome))

    async def status(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        handle = str(arguments["handle"])
        return answer(ctx, handle, await journaled(ctx, supervisor.status(caller, handle)))

    async def await_(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        handle = str(arguments["handle"])
        outcome = await journaled(ctx, await supervisor.await_(caller, handle))
        if isinstance(outcome, Refusal):
            return answer(ctx, handle, outcome)
        if not isinstance(outcome, Refusal) and not outcome.done and outcome.status == "running":
            result = reply(outcome)
            note = {"type": "text", "text": f"still running after {supervisor.settings.await_timeout:g} s"}
            return ControlResult((*result.content, note), structured=result.structured)
        return reply(outcome)

    async def cancel(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        reason = str(arguments.get("reason") or "cancelled by the parent agent")
        handle = str(arguments["handle"])
        return answer(ctx, handle, await journaled(ctx, await supervisor.cancel(caller, handle, reason)))

    return [
        ControlTool("subagent.spawn", "Delegate a task to a fresh subagent and get its distilled result "
                    "(or, with async, a handle at once; with warm, a session for subagent.send).",
                    SPAWN_SCHEMA, spawn, resumes=resumes),
        ControlTool("subagent.send", "Send the next message to a warm subagent session; returns its answer.",
                    SEND_SCHEMA, send),
        ControlTool("subagent.status", "Read a subagent's status (and its result once done).",
                    HANDLE_SCHEMA, status),
        ControlTool("subagent.await", "Wait up to 30 s for a subagent to finish; reports if still running.",
                    HANDLE_SCHEMA, await_),
        ControlTool("subagent.cancel", "Cancel a subagent and its whole subtree.", CANCEL_SCHEMA, cancel),
    ]


def offered_names() -> list[str]:
    """The names of the tools :func:`register_subagent_tools` offers (``agentd check`` lists them)."""
    unbound: Any = None  # the handlers are never called: only the names are read
    return [tool.name for tool in (*subagent_tools(unbound, unbound), graph_tool(unbound, unbound))]


def register_subagent_tools(registry: ControlToolRegistry, supervisor: Supervisor, caller: Caller) -> None:
    """Offer the ``subagent.*`` tools and ``graph.run`` to one run."""
    for tool in subagent_tools(supervisor, caller):
        registry.register(tool)
    registry.register(graph_tool(supervisor, caller))

    async def resume(journal: ChildJournal) -> None:
        await resume_children(supervisor, caller, journal)

    registry.on_resume(resume)
