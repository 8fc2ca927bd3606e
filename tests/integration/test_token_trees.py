"""The tree token ceiling is per run tree: a once-mode run, each daemon wake, each served spawn.

Sans-io checks of the ledger's tree accounting, then a real ``--mode loop`` daemon whose first wake
blows its ceiling while the next wake still spawns (the ceiling does not add up over the daemon's life).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from agentd.supervisor.caps import TREES_KEPT, Admission, Caps, Refusal, TreeLedger
from tests.integration.agents import agentd_worker, text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.waiting import until


def ledger(ceiling: int = 100) -> TreeLedger:
    return TreeLedger(Caps(token_ceiling=ceiling, spawn_burst=1000), root_scope=frozenset())


def test_wakes_are_separate_trees() -> None:
    led = ledger()
    assert led.add_tokens(150, tree="wake.1") is True  # the root's own usage in wake 1
    refused = led.admit("0", None, 0.0, tree="wake.1")
    assert isinstance(refused, Refusal) and "token_ceiling=100 reached (the tree used 150 tokens)" in refused.message
    admitted = led.admit("0", None, 0.0, tree="wake.2")
    assert not isinstance(admitted, Refusal)
    assert led.tokens_used == 150 and led.tree_tokens("wake.2") == 0


def test_descendant_usage_counts_in_its_top_level_ancestors_tree() -> None:
    led = ledger()
    child = led.admit("0", None, 0.0, tree="wake.2", budget=100)
    assert not isinstance(child, Refusal)
    grandchild = led.admit(child.handle, None, 0.0, budget=100)  # nested: asked up the channel, no tree given
    assert not isinstance(grandchild, Refusal)
    assert led.add_tokens(60, grandchild.handle) is False
    assert led.add_tokens(60, child.handle) is True  # 120 > 100 in wake.2
    assert led.tree_tokens("wake.2") == 120 and led.tree_tokens("") == 0
    assert isinstance(led.admit(child.handle, None, 0.0), Refusal)  # the tree is spent, however deep
    assert not isinstance(led.admit("0", None, 0.0, tree="wake.3"), Refusal)


def test_each_served_spawn_is_its_own_tree_but_shares_the_live_caps() -> None:
    led = TreeLedger(Caps(token_ceiling=100, max_subagents=2, spawn_burst=1000), root_scope=frozenset())
    assert led.add_tokens(500) is True  # the once-mode run spent its tree
    served = led.admit("0", None, 0.0, served=True)
    assert not isinstance(served, Refusal) and served.handle == "served.1"
    assert led.add_tokens(99, served.handle) is False
    assert led.tree_tokens("served.1") == 99
    assert isinstance(led.admit("0", None, 0.0), Refusal)  # the own run's tree is over its ceiling
    assert not isinstance(led.admit("0", None, 0.0, served=True), Refusal)
    third = led.admit("0", None, 0.0, served=True)
    assert isinstance(third, Refusal) and "max_subagents=2" in third.message  # one chokepoint for caps


def test_tree_counts_are_bounded() -> None:
    led = ledger()
    for n in range(TREES_KEPT + 10):
        led.add_tokens(1, tree=f"wake.{n}")
    assert led.tree_tokens("wake.0") == 0 and led.tree_tokens(f"wake.{TREES_KEPT + 9}") == 1
    assert led.tokens_used == TREES_KEPT + 10


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
async def test_daemon_wakes_each_get_the_whole_ceiling() -> None:
    hold = trio.Event()  # never set: the third wake waits here until the drain
    wakes: list[int] = []

    def reply(request: RecordedRequest) -> dict[str, Any]:
        user = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
        if "CHILD-TASK" in user:
            return text("child ok", usage={"prompt_tokens": 1, "completion_tokens": 1})
        if any(m.get("role") == "tool" for m in request.messages):
            return text("wake done", usage={"prompt_tokens": 1, "completion_tokens": 1})
        wakes.append(1)
        if len(wakes) == 1:  # the first wake spends more than its ceiling: it stops there, spawning nothing
            return tool_call("subagent_spawn", {"instruction": "CHILD-TASK"},
                             usage={"prompt_tokens": 30, "completion_tokens": 0})
        if len(wakes) == 2:
            return tool_call("subagent_spawn", {"instruction": "CHILD-TASK"},
                             usage={"prompt_tokens": 1, "completion_tokens": 1})
        return text("never", wait=hold)

    async with scripted_gateway(default=reply) as gw:
        argv = ["--mode", "loop", "--interval", "0", "--token-ceiling", "20", "--intelligence", gw.url,
                "--instruction", "WAKE-TASK", "--drain-timeout", "1"]
        async with agentd_worker(argv, serving=False) as daemon:
            await until(lambda: len(wakes) >= 3, timeout=60, what="three wakes")
        assert daemon.returncode == 0
    finals = [r for r in gw.requests if any(m.get("role") == "tool" for m in r.messages)
              and "CHILD-TASK" not in " ".join(text_of(m.get("content")) for m in r.messages if m.get("role") == "user")]
    observations = [text_of(r.messages[-1].get("content")) for r in finals]
    # the first wake made no request after the reply that crossed its ceiling; the second spawned in a tree of
    # its own, with the whole ceiling
    assert len(observations) == 1, observations
    assert "child ok" in observations[0] and "refused" not in observations[0]
    assert [e["budget"] for e in daemon.named("loop.budget")][:1] == ["token_ceiling"]
    # the daemon's document counts its whole tree: the wakes' own tokens, and the child's 1+1 once
    usage = daemon.result()["usage"]
    assert usage["own"]["total_tokens"] == 30 + 2 + 2 and usage["total_tokens"] == 30 + 2 + 2 + 2, usage


def test_a_spawn_reserves_a_slice_the_child_cannot_exceed_and_the_rest_is_refunded() -> None:
    led = ledger()  # token_ceiling=100
    first = led.admit("0", None, 0.0, tree="wake.1", budget=50)
    assert isinstance(first, Admission) and first.budget == 50
    second = led.admit("0", None, 0.0, tree="wake.1", budget=50)
    assert isinstance(second, Admission) and second.budget == 50
    refused = led.admit("0", None, 0.0, tree="wake.1", budget=1)  # both slices hold the whole ceiling
    assert isinstance(refused, Refusal) and refused.cap == "token_budget"
    assert "handle 0 has 0 tokens left of token_ceiling=100" in refused.message
    assert led.add_tokens(30, first.handle) is False
    assert led.add_tokens(21, first.handle) is True  # 51 > its slice of 50: its subtree is cancelled
    led.release(second.handle)  # ended having spent nothing: its 50 come back
    assert led.existing_book("wake.1").available("root") == 50
    again = led.admit("0", None, 0.0, tree="wake.1", budget=50)
    assert isinstance(again, Admission) and again.budget == 50


def test_without_a_token_budget_a_fan_out_within_max_children_gets_even_slices() -> None:
    led = TreeLedger(Caps(token_ceiling=900, max_children=8, spawn_burst=1000), root_scope=frozenset())
    slices = [led.admit("0", None, 0.0, tree="run-1") for _ in range(8)]
    assert [s.budget for s in slices if isinstance(s, Admission)] == [100] * 8  # no halving down to nothing
    assert led.existing_book("run-1").available("root") == 100  # and the root keeps a share of its own
    refused = led.admit("0", None, 0.0, tree="run-1")
    assert isinstance(refused, Refusal) and refused.cap == "max_children"


def test_saved_books_are_adopted_with_the_dead_childrens_slices_closed() -> None:
    from agentd.journal.ledger import Ledger

    before = ledger()
    child = before.admit("0", None, 0.0, tree="run-7", budget=60)
    assert isinstance(child, Admission)
    before.add_tokens(20, tree="run-7")  # the root's own run
    before.add_tokens(15, child.handle)
    saved = Ledger.restore(before.existing_book("run-7").snapshot())

    after = ledger()  # a restarted process: the child died with the old one
    assert after.adopt("run-7", saved) == ["0.1"]
    assert after.tree_tokens("run-7") == 35 and after.existing_book("run-7").available("root") == 65
    refused = after.admit("0", None, 0.0, tree="run-7", budget=66)
    assert isinstance(refused, Refusal) and refused.cap == "token_budget"
