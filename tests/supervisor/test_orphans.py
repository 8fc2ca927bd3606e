"""Nothing is orphaned: not when the supervisor process is SIGKILLed, not when trio's worker threads idle out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import trio

from tests.supervisor.conftest import ROOT, req, script

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
            deadline = time.monotonic() + 10
            while any(_alive(p) for p in tree) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not [p for p in tree if _alive(p)], "orphans survived the supervisor"
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
            await trio.sleep(12.5)
            assert (await plain.send(ROOT, a.handle, "still there?")).result["message"] == "still there?"
            assert (await forked.send(ROOT, b.handle, "still there?")).result["message"] == "still there?"
