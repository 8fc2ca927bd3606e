"""DoneWatch: an end reported between a waiter's read and its wait is not lost, a reconnect wakes every waiter,
and nothing is left behind (agentd.cluster.watch)."""

from __future__ import annotations

import trio

from agentd.cluster.watch import DoneWatch


async def test_an_end_reported_after_arming_wakes_the_waiter_and_leaves_nothing(autojump_clock):
    watch = DoneWatch()
    with watch.watching("cluster.a") as ended, watch.watching("cluster.a") as same:
        assert ended is same and len(watch) == 1
        watch.done("cluster.a")  # between the waiter's read and its wait
        with trio.fail_after(1):
            await ended.wait()
        watch.done("cluster.a")  # a second report for the same item is harmless
    assert len(watch) == 0
    watch.done("cluster.nobody")  # an item nobody waits for is ignored
    assert len(watch) == 0


async def test_a_new_wait_after_an_end_gets_a_fresh_event_and_a_reconnect_wakes_everyone(autojump_clock):
    watch = DoneWatch()
    with watch.watching("cluster.a") as first:
        watch.done("cluster.a")
        with watch.watching("cluster.a") as second:
            assert first.is_set() and not second.is_set()
            with watch.watching("cluster.b") as other:
                watch.recheck()  # the listener reconnected: what ended meanwhile was not heard
                assert second.is_set() and other.is_set()
    assert len(watch) == 0
