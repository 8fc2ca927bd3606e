"""Liveness and the child's control loop over memory streams, on trio's autojump clock (no processes)."""

from __future__ import annotations

import attrs
import trio
import trio.testing

from agentd.child.context import ChildContext
from agentd.child.session import _Session
from agentd.supervisor.authority import LocalAuthority
from agentd.supervisor.caps import Caps, TreeLedger
from agentd.supervisor.channel import ControlChannel
from agentd.supervisor.liveness import Liveness, LivenessSettings
from agentd.supervisor.messages import (
    Cancel,
    Inject,
    Ping,
    Pong,
    Progress,
    Ready,
    Result,
    RunPayload,
    Spawn,
)
from agentd.supervisor.node import SubagentNode
from agentd.telemetry.events import EventLog


def channel_pair() -> tuple[ControlChannel, ControlChannel]:
    a, b = trio.testing.memory_stream_pair()
    return ControlChannel(a, a), ControlChannel(b, b)


def test_liveness_verdicts():
    live = Liveness.starting_at(LivenessSettings(), 0.0)
    assert live.verdict(9.9) is None
    assert live.verdict(10.0) == "stuck: no pong for 10 s"
    live.pong(100.0)
    assert live.verdict(110.0) == "stuck: no pong for 10 s"
    live.pong(119.0)
    assert live.verdict(120.0) == "stuck: no progress for 120 s"
    live.turn_finished(120.0)
    live.pong(500.0)
    assert live.verdict(505.0) is None  # an idle warm session only has to answer pings
    live.ping_sent(530.0)
    assert live.verdict(539.9) is None
    assert live.verdict(540.0) == "stuck: no pong for 10 s"  # within pong_timeout of the ping
    live.turn_started(600.0)  # the unanswered ping still counts once a turn starts
    assert live.verdict(600.0) == "stuck: no pong for 10 s"


def _node(events: list) -> SubagentNode:
    ledger = TreeLedger(Caps(), frozenset())
    payload = RunPayload(handle="0.1", depth=1, instruction="x")
    return SubagentNode("0.1", payload, LocalAuthority(ledger), EventLog(sink=events.append))


async def test_the_pinger_marks_a_silent_child_stuck_after_the_pong_timeout(autojump_clock):
    events: list = []
    node = _node(events)
    parent, child = channel_pair()
    node._liveness = Liveness.starting_at(LivenessSettings(), trio.current_time())
    seen: list[int] = []

    async def silent_child():
        while (m := await child.receive()) is not None:
            seen.append(m.seq)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(silent_child)
        start = trio.current_time()
        await node._pinger(parent)
        assert node._failure == "stuck: no pong for 10 s"
        assert 10.0 <= trio.current_time() - start <= 10.0 + 3.3
        assert seen == [1, 2, 3]  # pings at 3.3, 6.6 and 9.9 s; the verdict at 13.2 s
        nursery.cancel_scope.cancel()
    assert [e["event"] for e in events] == ["subagent.stuck"]


async def test_a_child_that_pongs_and_progresses_is_never_stuck(autojump_clock):
    events: list = []
    node = _node(events)
    parent, child = channel_pair()
    node._liveness = Liveness.starting_at(LivenessSettings(), trio.current_time())

    async def healthy_child():
        async def progress():
            while True:
                await trio.sleep(60)
                await child.send(Progress(note="step"))
        async with trio.open_nursery() as inner:
            inner.start_soon(progress)
            while (m := await child.receive()) is not None:
                await child.send(Pong(seq=m.seq))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(healthy_child)
        nursery.start_soon(node._read, parent, nursery)
        with trio.move_on_after(3600):
            await node._pinger(parent)
        assert node._failure is None
        nursery.cancel_scope.cancel()


async def test_without_progress_a_ponging_child_is_stuck_after_120_s(autojump_clock):
    node = _node([])
    parent, child = channel_pair()
    node._liveness = Liveness.starting_at(LivenessSettings(), trio.current_time())

    async def ponging_child():
        while (m := await child.receive()) is not None:
            await child.send(Pong(seq=m.seq))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ponging_child)
        nursery.start_soon(node._read, parent, nursery)
        await node._pinger(parent)
        assert node._failure == "stuck: no progress for 120 s"
        nursery.cancel_scope.cancel()


async def test_an_idle_warm_session_is_pinged_seldom_and_at_the_working_pace_once_a_turn_starts(autojump_clock):
    node = _node([])
    parent, child = channel_pair()
    live = node._liveness = Liveness.starting_at(LivenessSettings(), trio.current_time())
    live.turn_finished(trio.current_time())
    pinged: list[float] = []

    async def ponging_child():
        while (m := await child.receive()) is not None:
            if isinstance(m, Ping):
                pinged.append(trio.current_time())
                await child.send(Pong(seq=m.seq))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ponging_child)
        nursery.start_soon(node._read, parent, nursery)
        nursery.start_soon(node._pinger, parent)
        start = trio.current_time()
        await trio.sleep(125)
        assert len(pinged) == 4  # every 30 s while idle (3.3 s would be 36)
        # A turn starts (send): the pinger wakes at once and pings at the working pace again.
        node.payload = attrs.evolve(node.payload, warm=True)
        node.status, node._channel = "awaiting_turn", parent
        await node.send("next")
        await trio.sleep(10)
        assert [round(t - start - 125, 1) for t in pinged[4:]] == [3.3, 6.6, 9.9]  # the working pace from the turn
        assert node._failure is None and pinged[0] - start == 30
        nursery.cancel_scope.cancel()


async def test_a_silent_idle_warm_session_is_stuck_after_an_unanswered_ping(autojump_clock):
    node = _node([])
    parent, child = channel_pair()
    live = node._liveness = Liveness.starting_at(LivenessSettings(), trio.current_time())
    live.turn_finished(trio.current_time())

    async def silent_child():
        while await child.receive() is not None:
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(silent_child)
        start = trio.current_time()
        await node._pinger(parent)
        # The ping at 30 s goes unanswered; the verdict comes at the next wake-up.
        assert node._failure == "stuck: no pong for 10 s"
        assert trio.current_time() - start == 60
        nursery.cancel_scope.cancel()


async def _run_session(payload: RunPayload, runner):
    parent, child = channel_pair()
    session = _Session(payload, child, runner)

    async def child_side():
        await session.run()
        await child.close_send()

    return parent, child_side


async def test_the_child_answers_pings_while_a_turn_is_busy_and_honours_cancel(autojump_clock):
    async def slow_model(ctx: ChildContext, message: str) -> Result:
        await trio.sleep(3600)  # a very slow model call
        return Result(status="completed", result="never")

    payload = RunPayload(handle="0.1", depth=1, instruction="go")
    parent, child_side = await _run_session(payload, slow_model)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(child_side)
        for seq in range(1, 6):
            await trio.sleep(30)
            await parent.send(Ping(seq=seq))
            with trio.fail_after(1):
                assert await parent.receive() == Pong(seq=seq)
        await parent.send(Cancel(reason="enough"))
        with trio.fail_after(5):
            final = await parent.receive()
        assert final == Result(status="cancelled", partial=True, result={"cancelled": "enough"})
        with trio.fail_after(5):
            assert await parent.receive() is None  # the child ends its session after a cancel


async def test_a_warm_child_takes_injected_messages_until_eof(autojump_clock):
    async def echo(ctx: ChildContext, message: str) -> Result:
        await trio.sleep(1)
        return Result(status="completed", result={"echo": message, "turn": len(ctx.history)})

    async def recording(ctx: ChildContext, message: str) -> Result:
        result = await echo(ctx, message)
        ctx.history.append({"role": "user", "content": message})
        return result

    payload = RunPayload(handle="0.1", depth=1, instruction="first", warm=True)
    parent, child_side = await _run_session(payload, recording)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(child_side)
        with trio.fail_after(10):
            assert (await parent.receive()).result == {"echo": "first", "turn": 0}
            await parent.send(Inject(message="second"))
            assert (await parent.receive()).result == {"echo": "second", "turn": 1}
            await parent.close_send()  # the ladder's EOF rung: a warm child ends its session
            assert await parent.receive() is None


async def test_frames_from_a_child_before_ready_are_typed(autojump_clock):
    parent, child = channel_pair()
    await child.send(Ready(pid=42))
    assert await parent.receive() == Ready(pid=42)
    await parent.send(Spawn(RunPayload(handle="0.3", depth=1, instruction="i")))
    assert (await child.receive()).payload.handle == "0.3"
