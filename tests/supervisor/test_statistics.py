"""The supervisor's public observation surface: statistics snapshots, wait_until and wait_ready."""

from __future__ import annotations

import sys

import pytest
import trio

from agentd.supervisor.node import NodeSettings
from agentd.supervisor.supervisor import NotReady, SupervisorSettings, open_supervisor
from tests.supervisor.conftest import FAST_GRACES, ROOT, req


async def test_statistics_follow_a_child_from_spawn_to_its_end(root):
    with trio.fail_after(20):
        async with root() as sup:
            assert sup.statistics().nodes == () and sup.statistics().tree_live == frozenset()
            await sup.spawn(ROOT, req(["usage", 2, 3], ["hang"], async_=True))
            child = await sup.wait_ready("0.1")
            assert (child.handle, child.ready, child.ended, child.warm) == ("0.1", True, False, False)
            assert child.pid is not None
            stats = await sup.wait_until(lambda s: s.tokens_used == 5)
            assert stats.node("0.1").usage_tokens == 5 and stats.tree_live == frozenset({"0.1"})
            assert stats.live_pids == (child.pid,) and stats.fork_server_pid is None
            await sup.cancel(ROOT, "0.1")
            after = sup.statistics()
            assert after.counts == {"cancelled": 1} and after.live == () and after.tree_live == frozenset()
            assert after.node("0.1").pid == child.pid  # an ended node keeps its pid


async def test_wait_until_is_woken_by_changes_not_by_time(autojump_clock):
    async with open_supervisor() as sup:
        seen: list[bool] = []

        def draining(stats):
            seen.append(stats.draining)
            return stats.draining

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sup.wait_until, draining)
            await trio.sleep(3600)  # an hour of (virtual) time without a change: tested once, never polled
            assert seen == [False]
            await sup.drain()
        assert seen == [False, True]


async def test_wait_ready_raises_for_a_child_that_ends_before_it_is_ready(no_leftover_children):
    settings = SupervisorSettings(graces=FAST_GRACES, node=NodeSettings(
        argv_tail=("-c", "import sys; sys.exit(3)"), python=sys.executable))
    with trio.fail_after(20):
        async with open_supervisor(settings=settings) as sup:
            view = await sup.spawn(ROOT, req(["echo"], async_=True))
            with pytest.raises(NotReady) as caught:
                await sup.wait_ready(view.handle)
            assert caught.value.view.status == "failed" and "status 3" in caught.value.view.result["error"]
            with pytest.raises(KeyError):
                await sup.wait_ready("0.9")
