"""The operator's switches in virtual time: a paused turn boundary waits until resume or drain, a lame duck
holds new runs until it ends or the daemon stops accepting, and cancel ends a registered run's scope."""

from __future__ import annotations

import trio

from agentd.oversight.drain import DrainLatch
from agentd.oversight.operator import Operator


async def test_pause_waits_at_the_boundary_until_resume(autojump_clock):
    operator, drain = Operator(), DrainLatch()
    operator.set_paused(True)
    passed = trio.Event()
    async with trio.open_nursery() as nursery:
        async def run() -> None:
            with operator.running("r1") as entry:
                await operator.turn_boundary(entry, drain)
                passed.set()

        nursery.start_soon(run)
        await trio.sleep(3600)
        assert not passed.is_set() and operator.runs()[0].paused
        assert operator.set_paused(False) == 1
        await passed.wait()
    assert operator.runs() == []


async def test_a_drain_ends_the_pause(autojump_clock):
    operator, drain = Operator(), DrainLatch()
    operator.set_paused(True)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async def run() -> None:
                with operator.running("r1") as entry:
                    await operator.turn_boundary(entry, drain)

            nursery.start_soon(run)
            await trio.sleep(1)
            drain.request("SIGTERM")
    assert operator.paused  # still paused; the run stopped waiting because of the drain


async def test_lame_duck_holds_new_runs_until_lifted_or_closed(autojump_clock):
    operator = Operator()
    operator.set_lame_duck(True)
    accepting = True
    admitted: list[bool] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _admit(operator, lambda: accepting, admitted))
        await trio.sleep(60)
        assert operator.held == 1 and admitted == []
        operator.set_lame_duck(False)
        await trio.sleep(0.1)
        assert admitted == [True] and operator.held == 0

        operator.set_lame_duck(True)
        nursery.start_soon(lambda: _admit(operator, lambda: accepting, admitted))
        await trio.sleep(60)
        accepting = False
        operator.poke()  # what DaemonRuns.close() does when the daemon drains
    assert admitted == [True, False]


async def _admit(operator: Operator, accepting, out: list[bool]) -> None:
    out.append(await operator.admit(accepting))


async def test_cancel_ends_the_registered_run(autojump_clock):
    operator = Operator()
    assert operator.cancel("nobody", "why") is False
    with operator.running("r1") as entry:
        assert operator.cancel("r1", "wrong customer") is True
        await trio.sleep(3600)
    assert entry.scope.cancelled_caught and entry.cancel_reason == "wrong customer"
