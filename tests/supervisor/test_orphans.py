"""Nothing is orphaned: not when the supervisor process is SIGKILLed, not when trio's worker threads idle out."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest
import trio

from agentd.supervisor.supervisor import SupervisorSettings, open_supervisor
from agentd.telemetry.events import EventLog, stream_sink
from tests.supervisor.conftest import FAST_GRACES, ROOT, _from_instruction, req, script
from tests.waiting import until_sync

_HOLDER = """
import json, sys, trio
from agentd.supervisor.supervisor import Caller, Origin, SpawnRequest, open_supervisor

def scripted(request, handle):
    return json.loads(request.instruction)

async def main():
    async with open_supervisor(test_script=scripted, fork_server=sys.argv[1] == "fork") as sup:
        await sup.spawn(Caller(Origin.STDIO), SpawnRequest(sys.argv[2], async_=True))
        stats = await sup.wait_until(lambda s: len(s.tree_live) >= 2 and all(n.ready for n in s.live))
        await trio.sleep(0.5)
        pids = list(stats.live_pids)
        if stats.fork_server_pid is not None:
            pids.append(stats.fork_server_pid)
        print(json.dumps(pids), flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _descendants_of(root: int) -> set[int]:
    from tests.peers.proctree import descendants
    return set(descendants(root))


@pytest.mark.parametrize("mode", ["re-exec", "fork"])
def test_sigkilling_the_supervisor_process_leaves_no_process_of_its_tree(mode, no_leftover_children):
    child_script = script(["spawn_async", {"instruction": script(["hang"])}], ["hang"])
    # As a context manager, so the holder's stdout pipe is closed however the test ends.
    with subprocess.Popen([sys.executable, "-c", _HOLDER, mode, child_script], stdout=subprocess.PIPE,
                          cwd=os.getcwd(), start_new_session=True) as holder:
        try:
            line = holder.stdout.readline()
            assert line, "the holder died before its tree was up"
            tree = _descendants_of(holder.pid)
            assert len(tree) >= (3 if mode == "fork" else 2)
            holder.kill()
            holder.wait(timeout=10)
            until_sync(lambda: not any(_alive(p) for p in tree), timeout=10,
                       what="no orphan outlives the supervisor")
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()


async def test_idle_children_outlive_trio_worker_threads(root):
    # trio starts processes from a cached worker thread that exits after ~10 s idle; a child that tied
    # its life to that thread (PR_SET_PDEATHSIG) would die here.
    with trio.fail_after(60):
        async with root() as plain, root(fork_server=True) as forked:
            a = await plain.spawn(ROOT, req(["echo"], warm=True))
            b = await forked.spawn(ROOT, req(["echo"], warm=True))
            await trio.sleep(12.5)  # real time: trio's idle worker threads exit after ~10 s of the real clock
            assert (await plain.send(ROOT, a.handle, "still there?")).result["message"] == "still there?"
            assert (await forked.send(ROOT, b.handle, "still there?")).result["message"] == "still there?"


def test_a_log_line_to_a_stream_whose_reader_is_gone_is_dropped():
    # An orphaned child's stderr is a pipe to its killed parent: its log lines must not raise (EPIPE).
    r, w = os.pipe()
    os.close(r)
    stream = os.fdopen(w, "w")
    try:
        sink = stream_sink(stream)
        sink({"event": "subagent.cancel", "handle": "0.1"})
        sink({"event": "subagent.exit", "handle": "0.1"})
    finally:
        _close_dead(stream)


def _close_dead(stream) -> None:
    with contextlib.suppress(BrokenPipeError):
        stream.close()  # the lines it could not write are still buffered


async def test_a_child_is_ended_although_the_log_reader_is_gone(no_leftover_children):
    # What an orphaned child does: its session scope is cancelled while its log (stderr) has no reader.
    # The node's own task is cancelled before the block's cleanup cancels it by name, so the ladder's
    # first log line is written from the node's shielded cleanup; it must not keep the child alive.
    r, w = os.pipe()
    stream = os.fdopen(w, "w")
    settings = SupervisorSettings(graces=FAST_GRACES, await_timeout=10.0)
    ended = False
    try:
        with trio.fail_after(40), trio.CancelScope() as outer:
            async with open_supervisor(settings=settings, log=EventLog(sink=stream_sink(stream)),
                                       test_script=_from_instruction) as sup:
                await sup.spawn(ROOT, req(["hang"], async_=True))
                stats = await sup.wait_until(lambda s: bool(s.live) and all(n.ready for n in s.live))
                os.close(r)
                outer.cancel()
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(15):
                        await sup.wait_until(lambda s: not s.live)
                        ended = True
                    for pid in [] if ended else stats.live_pids:  # so a failing run still ends
                        os.kill(pid, signal.SIGKILL)
    finally:
        _close_dead(stream)
    assert ended, "the child was never ended"
