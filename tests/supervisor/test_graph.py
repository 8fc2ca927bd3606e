"""graph.run: a diamond, a cycle, unknown ids, and a failing node that fails its dependents only."""

from __future__ import annotations

import pytest
import trio

from agentd.agent.control import ControlContext
from agentd.supervisor.graph import GraphError, GraphNode, check_graph, graph_tool, run_graph
from agentd.telemetry.events import null_log
from tests.supervisor.conftest import ROOT, script


def node(id, *steps, after=()):
    return GraphNode(id=id, instruction=script(*steps), after=tuple(after))


async def test_a_diamond_runs_in_dependency_order_and_hands_results_down(root, events):
    nodes = [
        node("d", ["echo"], after=["b", "c"]),
        node("a", ["result", "A"]),
        node("b", ["sleep", 0.3], ["result", "B"], after=["a"]),
        node("c", ["result", "C"], after=["a"]),
    ]
    with trio.fail_after(30):
        async with root() as sup:
            out = await run_graph(sup, ROOT, nodes)
    assert list(out) == ["d", "a", "b", "c"]
    assert {k: v["status"] for k, v in out.items()} == dict.fromkeys("dabc", "completed")
    assert out["d"]["result"]["context"] == [{"id": "b", "result": "B"}, {"id": "c", "result": "C"}]
    assert out["b"]["result"] == "B"
    spawned = [e["handle"] for e in events.named("subagent.spawn")]
    assert spawned[0] == out["a"]["handle"] and spawned[-1] == out["d"]["handle"]
    assert events.named("graph.end")[0]["failed"] == 0


async def test_a_failed_node_fails_its_dependents_not_its_siblings(root):
    nodes = [
        node("a", ["result", "A"]),
        node("b", ["crash", 4], after=["a"]),
        node("c", ["result", "C"], after=["a"]),
        node("d", ["echo"], after=["b"]),
        node("e", ["echo"], after=["d", "c"]),
    ]
    with trio.fail_after(30):
        async with root() as sup:
            out = await run_graph(sup, ROOT, nodes)
    assert {k: v["status"] for k, v in out.items()} == {
        "a": "completed", "b": "failed", "c": "completed", "d": "failed", "e": "failed"}
    assert out["d"]["result"] == {"error": "dependency failed: b"}
    assert out["e"]["result"] == {"error": "dependency failed: d"}


async def test_independent_nodes_wait_for_capacity_instead_of_failing(root):
    nodes = [node(str(i), ["sleep", 0.2], ["result", i]) for i in range(4)]
    with trio.fail_after(30):
        async with root(max_children=2) as sup:
            out = await run_graph(sup, ROOT, nodes)
    assert [v["result"] for v in out.values()] == [0, 1, 2, 3]


@pytest.mark.parametrize(("nodes", "message"), [
    ([node("a", after=["b"]), node("b", after=["a"]), node("c")], "the graph has a cycle through: a, b"),
    ([node("a", after=["a"])], "the graph has a cycle through: a"),
    ([node("a", after=["zz"])], "node a depends on unknown ids: zz"),
    ([node("a"), node("a")], "duplicate node ids: a"),
])
def test_bad_graphs_are_rejected_up_front(nodes, message):
    with pytest.raises(GraphError, match=message):
        check_graph(nodes)


async def test_the_tool_refuses_a_cycle_as_an_observation_without_spawning(root, events):
    with trio.fail_after(30):
        async with root() as sup:
            tool = graph_tool(sup, ROOT)
            ctx = ControlContext(run_id="r", log=null_log(), step=1)
            result = await tool.handler({"nodes": [
                {"id": "x", "instruction": "x", "after": ["y"]}, {"id": "y", "instruction": "y", "after": ["x"]}]}, ctx)
            assert result.is_error and result.content[0]["text"] == "graph refused: the graph has a cycle through: x, y"
            ok = await tool.handler({"nodes": [{"id": "x", "instruction": script(["result", 1])}]}, ctx)
            assert ok.structured["nodes"]["x"]["result"] == 1
    assert len(events.named("subagent.spawn")) == 1
