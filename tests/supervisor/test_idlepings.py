"""The supervisor's one timer for idle warm sessions, over real pipes, on trio's autojump clock."""

from __future__ import annotations

import os

import attrs
import trio
import trio.testing

from agentd.supervisor.authority import LocalAuthority
from agentd.supervisor.caps import Caps, TreeLedger
from agentd.supervisor.channel import ControlChannel
from agentd.supervisor.idlepings import IdlePings
from agentd.supervisor.liveness import Liveness, LivenessSettings
from agentd.supervisor.messages import Ping, Pong, RunPayload
from agentd.supervisor.node import SubagentNode
from agentd.telemetry.events import EventLog


def pipe_pair() -> tuple[ControlChannel, ControlChannel]:
    """(parent, child) channels over two real pipes, as between a supervisor and a forked child."""
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    fd = trio.lowlevel.FdStream
    return ControlChannel(fd(down_w), fd(up_r)), ControlChannel(fd(up_w), fd(down_r))


def idle_node(events: list, handle: str, channel: ControlChannel, pings: IdlePings | None) -> SubagentNode:
    ledger = TreeLedger(Caps(), frozenset())
    payload = RunPayload(handle=handle, depth=1, instruction="x", warm=True)
    node = SubagentNode(handle, payload, LocalAuthority(ledger), EventLog(sink=events.append), idle_pings=pings)
    node._liveness = Liveness.starting_at(LivenessSettings(), trio.current_time())
    node._liveness.turn_finished(trio.current_time())
    node._channel = channel
    return node


async def answer(child: ControlChannel, seen: list[float], pong: bool = True) -> None:
    while (m := await child.receive()) is not None:
        assert isinstance(m, Ping)
        seen.append(trio.current_time())
        if pong:
            assert child.send_nowait(Pong(seq=m.seq))


async def test_a_silent_idle_session_is_stuck_at_the_same_time_with_the_shared_timer(autojump_clock):
    events: list = []
    async with trio.open_nursery() as nursery:
        pings = IdlePings(nursery)
        parent, child = pipe_pair()
        node = idle_node(events, "0.1", parent, pings)
        seen: list[float] = []
        nursery.start_soon(answer, child, seen, False)
        start = trio.current_time()
        nursery.start_soon(node._pinger, parent)  # it waits for a turn; the timer pings and judges meanwhile
        await node._stop.wait()
        # As with its own pinger: the ping at 30 s goes unanswered, the verdict comes at the next round.
        assert node._failure == "stuck: no pong for 10 s"
        assert trio.current_time() - start == 60
        assert [t - start for t in seen] == [30]
        assert [e["event"] for e in events] == ["subagent.stuck"]
        nursery.cancel_scope.cancel()


async def test_one_round_pings_every_idle_session_due_and_a_silent_one_is_still_found(autojump_clock):
    events: list = []
    steps = _Steps()
    trio.lowlevel.add_instrument(steps)
    async with trio.open_nursery() as nursery:
        pings = IdlePings(nursery)
        nodes, seen = [], []
        for i in range(20):
            parent, child = pipe_pair()
            node = idle_node(events, f"0.{i + 1}", parent, pings)
            nodes.append(node)
            seen.append([])
            nursery.start_soon(node._read, parent, nursery)
            nursery.start_soon(answer, child, seen[-1], i != 7)  # 0.8 never answers
            nursery.start_soon(node._pinger, parent)
            await trio.sleep(0.1)  # registered 0.1 s apart: all within one round's reach
        steps.count = steps.pingers = 0
        await trio.sleep(301 - 2)
        # Every session pinged every 30 s, all in one round each time (the first round took the sessions
        # registered up to 3 s after the first one), except the silent one, found at its second round.
        for i, times in enumerate(seen):
            assert len(times) == (1 if i == 7 else 10), i
        assert len({t for times in seen for t in times}) == 10
        assert pings.rounds == 10
        assert [n.handle for n in nodes if n._failure] == ["0.8"]
        assert nodes[7]._failure == "stuck: no pong for 10 s"
        # The idle nodes' own pingers never woke: a round is one step of the timer, then one step of each
        # child's reader for the ping and one of the node's reader for the pong (no task per ping, no send
        # lock, no checkpoint per write or read).
        sent = sum(len(times) for times in seen)
        assert pings.rounds + 2 * sent - 10 <= steps.count <= pings.rounds + 2 * sent + 10, (steps.count, sent)
        assert steps.pingers == 0
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class _Steps(trio.abc.Instrument):
    count: int = 0
    pingers: int = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.count += 1
        if task.name.endswith("._pinger"):
            self.pingers += 1


async def test_sessions_idle_far_apart_are_pinged_in_separate_rounds(autojump_clock):
    async with trio.open_nursery() as nursery:
        pings = IdlePings(nursery)
        seen: list[list[float]] = [[], []]
        start = trio.current_time()
        for i in range(2):
            parent, child = pipe_pair()
            node = idle_node([], f"0.{i + 1}", parent, pings)
            nursery.start_soon(node._read, parent, nursery)
            nursery.start_soon(answer, child, seen[i])
            nursery.start_soon(node._pinger, parent)
            await trio.sleep(10)  # more than a round's reach (3 s of a 30 s interval) apart
        await trio.sleep(100)
        assert [[round(t - start) for t in s] for s in seen] == [[30, 60, 90], [40, 70, 100]]
        nursery.cancel_scope.cancel()


async def test_a_turn_takes_the_session_off_the_timer_and_back_on_when_it_ends(autojump_clock):
    async with trio.open_nursery() as nursery:
        pings = IdlePings(nursery)
        parent, child = pipe_pair()
        node = idle_node([], "0.1", parent, pings)
        node.status = "awaiting_turn"
        seen: list[float] = []
        nursery.start_soon(node._read, parent, nursery)
        nursery.start_soon(node._pinger, parent)
        start = trio.current_time()

        async def child_side() -> None:
            while (m := await child.receive()) is not None:
                if isinstance(m, Ping):
                    seen.append(trio.current_time() - start)
                    await child.send(Pong(seq=m.seq))

        nursery.start_soon(child_side)
        await trio.sleep(35)
        await node.send("next")  # the working pace, from the node's own pinger
        await trio.sleep(10)
        assert [round(t, 1) for t in seen] == [30, 38.3, 41.6, 44.9]
        assert node._failure is None
        nursery.cancel_scope.cancel()


async def test_send_nowait_writes_a_whole_frame_or_nothing():
    parent, child = pipe_pair()
    assert parent.send_nowait(Ping(seq=1))
    assert await child.receive() == Ping(seq=1)
    async with parent._send_lock:  # another send holds the channel: not now
        assert not parent.send_nowait(Ping(seq=2))
    while parent.send_nowait(Ping(seq=3)):  # fill the pipe: the last frame is refused whole
        pass
    await parent.close_send()
    frames = 0
    while (m := await child.receive()) is not None:
        assert m == Ping(seq=3)
        frames += 1
    assert frames > 100
    a, _ = trio.testing.memory_stream_pair()
    assert not ControlChannel(a, a).send_nowait(Ping(seq=1))  # not a pipe: the caller sends it


async def test_a_ping_that_cannot_be_written_at_once_is_sent_by_a_bounded_task(autojump_clock):
    async with trio.open_nursery() as nursery:
        pings = IdlePings(nursery)
        a, b = trio.testing.memory_stream_pair()  # not a pipe: no plain write
        parent, child = ControlChannel(a, a), ControlChannel(b, b)
        node = idle_node([], "0.1", parent, pings)
        seen: list[float] = []
        nursery.start_soon(node._read, parent, nursery)
        nursery.start_soon(node._pinger, parent)
        start = trio.current_time()

        async def child_side() -> None:
            while (m := await child.receive()) is not None:
                seen.append(trio.current_time() - start)
                await child.send(Pong(seq=m.seq))

        nursery.start_soon(child_side)
        await trio.sleep(95)
        assert seen == [30, 60, 90] and node._failure is None
        pings.close()  # the supervisor ends: no more rounds
        await trio.sleep(60)
        assert seen == [30, 60, 90]
        nursery.cancel_scope.cancel()


def test_a_ping_or_pong_from_the_template_is_byte_for_byte_the_generic_frame():
    from agentd.supervisor.channel import _seq_frame
    from agentd.supervisor.framing import MAX_FRAME, encode_frame
    from agentd.supervisor.messages import Cancel, to_frame

    for seq in (0, 1, 7, 2**31, 2**70, -3):
        for message in (Ping(seq=seq), Pong(seq=seq)):
            assert _seq_frame(message, MAX_FRAME) == encode_frame(to_frame(message))
    assert _seq_frame(Ping(seq=True), MAX_FRAME) is None  # JSON says true: the generic path
    assert _seq_frame(Cancel(reason="x"), MAX_FRAME) is None
