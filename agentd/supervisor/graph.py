"""``graph.run``: subagents as the nodes of a dependency graph.

``{nodes: [{id, instruction, output_contract?, tool_scope?, after: [ids]}]}``. The graph is checked up
front (unique ids, known dependencies, no cycles) and refused as a whole otherwise. Each node is a sync
spawn in its own task that starts as soon as its dependencies have completed, with their results handed
over as context; independent nodes run concurrently. A node refused for capacity (children, total, rate)
waits and retries, so the caps bound the graph's concurrency instead of failing it; any other refusal
fails the node. A node that does not complete fails its dependents (transitively), not its siblings.
The answer maps every id to ``{status, partial, result}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from agentd.agent.control import ChildJournal, ControlContext, ControlResult, ControlTool
from agentd.supervisor.caps import Refusal
from agentd.supervisor.supervisor import Caller, SpawnRequest, Supervisor

GRAPH_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "nodes": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "instruction": {"type": "string", "minLength": 1},
                    "output_contract": {"type": "string"},
                    "tool_scope": {"type": "array", "items": {"type": "string"}},
                    "after": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["id", "instruction"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["nodes"],
    "additionalProperties": False,
}

#: Upper bound on a single wait for capacity before re-asking the chokepoint.
_CAPACITY_POLL = 1.0


class GraphError(ValueError):
    """The graph is not runnable (duplicate or unknown ids, a cycle); nothing was spawned."""


@attrs.frozen
class GraphNode:
    id: str
    instruction: str
    output_contract: str | None = None
    tool_scope: tuple[str, ...] | None = None
    after: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GraphNode:
        scope = data.get("tool_scope")
        return cls(
            id=str(data["id"]), instruction=str(data["instruction"]),
            output_contract=data.get("output_contract"),
            tool_scope=None if scope is None else tuple(scope), after=tuple(data.get("after", ())),
        )


def check_graph(nodes: Sequence[GraphNode]) -> list[str]:
    """Validate and return a topological order; raise :class:`GraphError` naming the problem."""
    ids = [n.id for n in nodes]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise GraphError(f"duplicate node ids: {', '.join(dupes)}")
    known = set(ids)
    for node in nodes:
        unknown = [d for d in node.after if d not in known]
        if unknown:
            raise GraphError(f"node {node.id} depends on unknown ids: {', '.join(unknown)}")
    indegree = {n.id: len(set(n.after)) for n in nodes}
    dependents: dict[str, list[str]] = {n.id: [] for n in nodes}
    for node in nodes:
        for dep in set(node.after):
            dependents[dep].append(node.id)
    ready = [i for i in ids if indegree[i] == 0]
    order: list[str] = []
    while ready:
        current = ready.pop(0)
        order.append(current)
        for nxt in dependents[current]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if len(order) != len(nodes):
        cyclic = sorted(i for i in ids if i not in order)
        raise GraphError(f"the graph has a cycle through: {', '.join(cyclic)}")
    return order


def number_after_journaled(supervisor: Supervisor, caller: Caller, journal: ChildJournal | None) -> None:
    """A resumed run's new children are numbered after those an earlier process spawned: a handle in the
    run's journal (and in the model's conversation) never names two children."""
    ledger = getattr(supervisor.authority, "ledger", None)
    if journal is None or ledger is None:
        return
    numbers = [int(n) for parent, _, n in (h.rpartition(".") for h in journal.journaled_children())
               if parent == caller.handle and n.isdigit()]
    if numbers:
        ledger.mint_after(caller.handle, max(numbers))


def child_run(ctx: ControlContext) -> str | None:
    """The run id a child started by this call journals its own steps under: the parent's run, the step and the
    model's call id (``RUN/STEP.CALL``). The call's request is committed before the call is made, so the same call
    made again after a crash names the same run, which the child then resumes, or replays once it ended
    (docs/durability.md). None when the parent's run is not journaled."""
    return f"{ctx.run_id}/{ctx.step}.{ctx.call_id}" if ctx.journal is not None and ctx.call_id else None


async def run_graph(supervisor: Supervisor, caller: Caller, nodes: Sequence[GraphNode], *,
                    journal: ChildJournal | None = None, step: int = 0, run: str | None = None) -> dict[str, Any]:
    """Run a checked graph; returns ``{id: {status, partial, result}}`` for every node.

    With ``journal`` (the run's, ``--state-dir``) each node's child is journaled like a ``subagent.spawn``:
    a ``spawn`` record at ``step`` and its ``child.result`` when it ends; with ``run`` (:func:`child_run`), each
    node's child journals its own run as ``RUN/NODE``."""
    check_graph(nodes)
    outcomes: dict[str, dict[str, Any]] = {}
    finished = {n.id: trio.Event() for n in nodes}
    supervisor.log.info("graph.start", nodes=len(nodes), caller=caller.handle)

    async def run_node(node: GraphNode) -> None:
        try:
            for dep in node.after:
                await finished[dep].wait()
            failed = [d for d in node.after if outcomes[d]["status"] != "completed"]
            if failed:
                outcomes[node.id] = {"status": "failed", "partial": False,
                                     "result": {"error": f"dependency failed: {', '.join(failed)}"}}
                return
            context = tuple({"id": d, "result": outcomes[d]["result"]} for d in node.after)
            request = SpawnRequest(instruction=node.instruction, output_contract=node.output_contract,
                                   tool_scope=node.tool_scope, context=context,
                                   journal_run=f"{run}/{node.id}" if run is not None else None,
                                   journal_new=run is not None and journal is not None and journal.new,
                                   journal_parent=run is not None)
            while True:
                outcome = await supervisor.spawn(caller, request)
                if not (isinstance(outcome, Refusal) and outcome.retryable):
                    break
                with trio.move_on_after(max(outcome.retry_after, 0.05) if outcome.retry_after else _CAPACITY_POLL):
                    await supervisor.wait_changed()
            if isinstance(outcome, Refusal):
                outcomes[node.id] = {"status": "failed", "partial": False, "result": {"error": outcome.message}}
            else:
                if journal is not None:  # its spawn and (over, as a node's child is) its end: one commit
                    await journal.spawned(step, outcome.handle, node.instruction, None, request.journal_run,
                                          ended=(outcome.status, outcome.result) if outcome.done else None)
                outcomes[node.id] = {"handle": outcome.handle, "status": outcome.status,
                                     "partial": outcome.partial, "result": outcome.result}
        finally:
            if node.id in outcomes:
                supervisor.log.info("graph.node", id=node.id, status=outcomes[node.id]["status"])
            finished[node.id].set()

    async with trio.open_nursery() as nursery:
        for node in nodes:
            nursery.start_soon(run_node, node)
    supervisor.log.info("graph.end", nodes=len(nodes),
                        failed=sum(1 for o in outcomes.values() if o["status"] != "completed"))
    return {n.id: outcomes[n.id] for n in nodes}


def graph_tool(supervisor: Supervisor, caller: Caller) -> ControlTool:
    async def handler(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        nodes = [GraphNode.from_json(n) for n in arguments["nodes"]]
        try:
            number_after_journaled(supervisor, caller, ctx.journal)
            results = await run_graph(supervisor, caller, nodes, journal=ctx.journal, step=ctx.step,
                                      run=child_run(ctx))
        except GraphError as exc:
            return ControlResult.text(f"graph refused: {exc}", is_error=True)
        structured = {"nodes": results}
        return ControlResult(({"type": "text", "text": json.dumps(structured, default=str)},),
                             structured=structured)

    return ControlTool(
        "graph.run",
        "Run subagents as a dependency graph: each node starts when the nodes in its 'after' list have "
        "completed and receives their results; returns every node's {status, partial, result}.",
        GRAPH_SCHEMA, handler,
        resumes=lambda _arguments: True,  # each node's child resumes (or replays) its own journaled run
    )
