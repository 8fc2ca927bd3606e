"""Children that misbehave: each ends as ``status: failed`` with a reason, and the parent keeps going.
The kill ladder reaches each rung with real short graces (the process boundary has no mock clock)."""

from __future__ import annotations

import pytest
import trio

from agentd.supervisor.liveness import LivenessSettings
from tests.supervisor.conftest import ROOT, req


@pytest.mark.parametrize(("steps", "reason"), [
    ([["crash", 3]], "exited (status 3) before reporting a result"),
    ([["exit"]], "exited (status 0) before reporting a result"),
    ([["garbage"]], "broke the control channel: bad frame: frame of 5 bytes is not valid JSON"),
    ([["oversize"]], "broke the control channel: bad frame: frame length 67108864 exceeds the 16777216-byte cap"),
    ([["fail", "model exploded"]], "subagent failed: RuntimeError: model exploded"),
])
async def test_a_broken_child_is_a_failed_run_and_the_parent_goes_on(root, steps, reason):
    with trio.fail_after(20):
        async with root() as sup:
            view = await sup.spawn(ROOT, req(*steps))
            assert (view.status, view.done) == ("failed", True)
            assert reason in view.result["error"]
            after = await sup.spawn(ROOT, req(["result", "still here"]))
            assert after.result == "still here"


async def test_a_child_killed_by_a_signal_is_reported_as_a_crash(root):
    with trio.fail_after(20):
        async with root() as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True))
            child = await sup.wait_ready("0.1")
            import os
            import signal
            os.kill(child.pid, signal.SIGKILL)
            view = await sup.await_(ROOT, "0.1")
    assert view.status == "failed" and "killed by signal 9" in view.result["error"]


@pytest.mark.parametrize(("flags", "rung"), [
    ({}, "cancel"),
    ({"ignore_cancel": True}, "eof"),
    ({"ignore_cancel": True, "ignore_eof": True}, "sigterm"),
    ({"ignore_cancel": True, "ignore_eof": True, "ignore_sigterm": True}, "sigkill"),
])
async def test_the_kill_ladder_reaches_each_rung(root, events, flags, rung):
    with trio.fail_after(20):
        async with root() as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True, flags=flags))
            await sup.wait_ready("0.1")
            view = await sup.cancel(ROOT, "0.1")
    assert view.status == "cancelled"
    assert events.named("subagent.exit", handle="0.1")[0]["rung"] == rung
    if rung in ("sigterm", "sigkill"):
        assert events.named(f"subagent.{rung}", handle="0.1")


async def test_a_child_that_stops_answering_pings_is_stuck(root, events):
    fast = LivenessSettings(ping_interval=0.1, pong_timeout=0.6, progress_timeout=60)
    with trio.fail_after(20):
        async with root(liveness=fast) as sup:
            view = await sup.spawn(ROOT, req(["hang"], flags={"no_pong": True}))
    assert view.status == "failed" and view.result["error"] == "stuck: no pong for 0.6 s"
    assert events.named("subagent.stuck", handle="0.1")


async def test_a_child_without_progress_is_stuck_but_pongs_keep_an_idle_one_alive(root):
    # Real time: the progress timeout is generous enough for a warm child's first answer on a loaded machine.
    fast = LivenessSettings(ping_interval=0.1, pong_timeout=5, progress_timeout=3)
    with trio.fail_after(30):
        async with root(liveness=fast) as sup:
            view = await sup.spawn(ROOT, req(["hang"]))
            assert view.result["error"] == "stuck: no progress for 3 s"
            # An idle warm session is not stalling: it outlives more than one progress timeout.
            warm = await sup.spawn(ROOT, req(["echo"], warm=True))
            # real time: more than the 3 s progress timeout passes for the real child processes too
            await trio.sleep(4.5)
            assert sup.status(ROOT, warm.handle).status == "awaiting_turn"
            assert (await sup.send(ROOT, warm.handle, "hi")).result["message"] == "hi"


async def test_stderr_is_drained_into_events(root, events):
    with trio.fail_after(20):
        async with root() as sup:
            await sup.spawn(ROOT, req(["fail", "visible on stderr?"]))
    # The child's own events are JSON lines on its stderr; whatever it writes arrives as subagent.stderr.
    assert all(e["handle"] == "0.1" for e in events.named("subagent.stderr"))
