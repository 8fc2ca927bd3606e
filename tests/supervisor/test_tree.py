"""Caps at the one chokepoint with real nested children, the token ceiling, drain, and whole-tree teardown."""

from __future__ import annotations

import json

import trio

from agentd.agent.control import ControlContext, ControlToolRegistry
from agentd.supervisor.caps import Refusal
from agentd.supervisor.tools import register_subagent_tools
from agentd.telemetry.events import null_log
from tests.peers import proctree
from tests.supervisor.conftest import ROOT, req, script
from tests.waiting import until


def nested(*steps, **kw):
    return {"instruction": script(*steps), **kw}


async def test_nested_spawns_are_admitted_by_the_root_with_minted_depth(root):
    with trio.fail_after(30):
        async with root(max_depth=3) as sup:
            view = await sup.spawn(ROOT, req(["spawn", nested(["spawn", nested(["echo"])])]))
    inner = view.result["spawned"][0]
    assert inner["handle"] == "0.1.1" and inner["status"] == "completed"
    deepest = inner["result"]["spawned"][0]
    assert deepest == {"refused": "spawn refused: max_depth=3 reached at handle 0.1.1"}


async def test_scope_narrowing_holds_down_the_tree(root):
    with trio.fail_after(30):
        async with root() as sup:
            view = await sup.spawn(ROOT, req(
                ["spawn", nested(["echo"])], ["spawn", nested(["echo"], tool_scope=["web"])], tool_scope=("fs",)))
            assert [s.get("refused", s.get("result", {}).get("tool_scope")) for s in view.result["spawned"]] == [
                ["fs"], "spawn refused: tool_scope names servers outside the scope of handle 0.1: web"]
            wider = await sup.spawn(ROOT, req(["echo"], tool_scope=("fs", "db")))
            assert isinstance(wider, Refusal) and wider.message.endswith("handle 0: db")


async def test_children_and_total_caps_are_refused_as_data(root):
    with trio.fail_after(30):
        async with root(max_children=2, max_subagents=3) as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True))
            await sup.spawn(ROOT, req(["spawn_async", nested(["hang"])], ["hang"], async_=True))
            await sup.wait_until(lambda s: "0.2.1" in s.tree_live)
            over = await sup.spawn(ROOT, req(["echo"]))
            assert over == Refusal("spawn refused: max_subagents=3 reached at handle 0", retryable=True,
                                   cap="max_subagents")
            await sup.cancel(ROOT, "0.2")
            await sup.spawn(ROOT, req(["hang"], async_=True))
            third = await sup.spawn(ROOT, req(["echo"]))
            assert third == Refusal("spawn refused: max_children=2 reached at handle 0", retryable=True,
                                    cap="max_children")


async def test_the_rate_bucket_refuses_a_burst(root):
    with trio.fail_after(30):
        async with root(spawn_burst=2, spawn_rate=0.5) as sup:
            for _ in range(2):
                await sup.spawn(ROOT, req(["hang"], async_=True))
            third = await sup.spawn(ROOT, req(["echo"]))
            assert isinstance(third, Refusal) and third.retryable
            assert third.message.startswith("spawn refused: spawn rate limit (burst 2, 0.5/s) at handle 0")


async def test_the_subtree_that_passes_the_token_ceiling_is_cancelled_partial(root, events):
    with trio.fail_after(30):
        async with root(token_ceiling=1000) as sup:
            view = await sup.spawn(ROOT, req(["spawn", nested(["usage", 900, 200], ["hang"])], ["hang"]))
            assert (view.status, view.partial, view.done) == ("cancelled", True, True)
            assert sup.statistics().tokens_used == 1100
            refused = await sup.spawn(ROOT, req(["echo"]))
            assert refused.message == "spawn refused: token_ceiling=1000 reached (the tree used 1100 tokens)"
    assert events.named("subagent.cancel", handle="0.1")[0]["reason"] == "token_ceiling"


async def test_cancelling_a_parent_ends_its_whole_subtree_deepest_first(root, events):
    with trio.fail_after(30):
        async with root() as sup:
            # Processes that predate the spawn (session-scoped peers of this xdist worker) are not the subtree.
            before = set(proctree.descendants())
            await sup.spawn(ROOT, req(["spawn", nested(["spawn", nested(["hang"])])], async_=True))
            def subtree() -> list[int] | None:
                tree = [p for p in proctree.descendants() if p not in before]
                return tree if len(tree) >= 3 else None  # admitted, then started

            tree = await until(subtree, timeout=30, what="the three processes of the subtree")
            await sup.cancel(ROOT, "0.1")
            assert sup.statistics().tree_live == frozenset()
            assert not [p for p in proctree.descendants() if p in tree]


async def test_a_sigkilled_middle_child_takes_its_subtree_along(root):
    import os
    import signal
    with trio.fail_after(30):
        async with root() as sup:
            await sup.spawn(ROOT, req(["spawn", nested(["hang"])], async_=True))
            await sup.wait_until(lambda s: len(s.tree_live) == 2)
            os.kill(sup.statistics().node("0.1").pid, signal.SIGKILL)
            view = await sup.await_(ROOT, "0.1")
            assert view.status == "failed"
            # The grandchild sees its parent die (pidfd) and exits; the ledger forgets the subtree.
            assert sup.statistics().tree_live == frozenset()


async def test_drain_lets_running_work_finish_then_cancels_the_rest(root):
    with trio.fail_after(30):
        async with root() as sup:
            quick = await sup.spawn(ROOT, req(["sleep", 0.5], ["result", "done"], async_=True))
            slow = await sup.spawn(ROOT, req(["hang"], async_=True))
            idle = await sup.spawn(ROOT, req(["echo"], warm=True))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sup.drain, 2.0)
                await sup.wait_until(lambda s: s.draining)
                refused = await sup.spawn(ROOT, req(["echo"]))
                assert isinstance(refused, Refusal) and "draining" in refused.message
            assert sup.status(ROOT, quick.handle).result == "done"
            assert sup.status(ROOT, slow.handle).status == "cancelled"
            assert sup.status(ROOT, idle.handle).status == "cancelled"


async def test_the_control_tools_go_through_the_chokepoint(root):
    with trio.fail_after(30):
        async with root(max_depth=1) as sup:
            registry = ControlToolRegistry()
            register_subagent_tools(registry, sup, ROOT)
            assert [t.name for t in registry] == [
                "subagent.spawn", "subagent.send", "subagent.status", "subagent.await", "subagent.cancel",
                "graph.run"]
            ctx = ControlContext(run_id="r", log=null_log(), step=1)
            refused = await registry.get("subagent.spawn").handler({"instruction": script(["echo"])}, ctx)
            assert refused.is_error and refused.content[0]["text"] == "spawn refused: max_depth=1 reached at handle 0"


async def test_control_tool_results_share_one_shape(root):
    with trio.fail_after(30):
        async with root() as sup:
            registry = ControlToolRegistry()
            register_subagent_tools(registry, sup, ROOT)
            ctx = ControlContext(run_id="r", log=null_log(), step=1)
            call = lambda name, args: registry.get(name).handler(args, ctx)  # noqa: E731
            sync = await call("subagent.spawn", {"instruction": script(["result", 7])})
            ack = await call("subagent.spawn", {"instruction": script(["hang"]), "async": True})
            assert set(sync.structured) == set(ack.structured) == {"handle", "status", "done", "partial", "result",
                                                                   "usage"}
            assert json.loads(sync.content[0]["text"]) == sync.structured == {
                "handle": "0.1", "status": "completed", "done": True, "partial": False, "result": 7,
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
            status = await call("subagent.status", {"handle": "0.2"})
            assert status.structured["done"] is False
            cancelled = await call("subagent.cancel", {"handle": "0.2", "reason": "stop"})
            assert cancelled.structured["status"] == "cancelled"
            unknown = await call("subagent.status", {"handle": "0.77"})
            assert unknown.is_error


async def test_control_tools_on_a_local_warm_child_carry_each_turns_result_and_counter(root):
    """The in-loop tools on a warm child: every answer names the turn it is (``turns``) next to that turn's
    result, and ``status``/``await`` between turns read the latest turn without waiting for the session."""
    with trio.fail_after(30):
        async with root() as sup:
            registry = ControlToolRegistry()
            register_subagent_tools(registry, sup, ROOT)
            ctx = ControlContext(run_id="r", log=null_log(), step=1)
            call = lambda name, args: registry.get(name).handler(args, ctx)  # noqa: E731
            first = (await call("subagent.spawn", {"instruction": script(["echo"]), "warm": True})).structured
            assert (first["status"], first["done"], first["turns"]) == ("awaiting_turn", False, 1)
            sent = await call("subagent.send", {"handle": "0.1", "message": "second"})
            assert json.loads(sent.content[0]["text"]) == sent.structured
            assert (sent.structured["turns"], sent.structured["result"]["message"]) == (2, "second")
            for name in ("subagent.status", "subagent.await"):
                view = (await call(name, {"handle": "0.1"})).structured
                assert (view["status"], view["turns"], view["result"]["message"]) == ("awaiting_turn", 2, "second")
            ended = (await call("subagent.cancel", {"handle": "0.1"})).structured
            assert (ended["status"], ended["done"], ended["turns"]) == ("cancelled", True, 2)
            cold = (await call("subagent.spawn", {"instruction": script(["result", 1])})).structured
            assert "turns" not in cold  # only a warm session counts turns
