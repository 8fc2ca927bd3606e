"""The same guarantees when children are forked from the pre-imported fork server."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from agentd.supervisor.caps import Refusal
from tests.peers import proctree
from tests.supervisor.conftest import ROOT, req, script


async def test_forked_children_run_sync_async_and_warm(root, events):
    with trio.fail_after(40):
        async with root(fork_server=True) as sup:
            sync = await sup.spawn(ROOT, req(["usage", 2, 3], ["echo"]))
            assert (sync.status, sync.result["handle"]) == ("completed", "0.1")
            server_pid = sup.statistics().fork_server_pid
            assert server_pid is not None
            # Forked, not re-executed: the child's parent is the fork server, in its own session.
            late = await sup.spawn(ROOT, req(["hang"], async_=True))
            pid = (await sup.wait_ready(late.handle)).pid
            assert proctree.descendants()[pid].ppid == server_pid
            assert os.getsid(pid) == pid
            warm = await sup.spawn(ROOT, req(["echo"], warm=True))
            assert (await sup.send(ROOT, warm.handle, "again")).result["message"] == "again"
            nested = await sup.spawn(ROOT, req(["spawn", {"instruction": script(["result", "deep"])}]))
            assert nested.result["spawned"][0]["result"] == "deep"
    assert events.named("subagent.exit", handle="0.1")[0]["usage_tokens"] == 5


@pytest.mark.parametrize(("flags", "rung"), [
    ({}, "cancel"),
    ({"ignore_cancel": True}, "eof"),
    ({"ignore_cancel": True, "ignore_eof": True}, "sigterm"),
    ({"ignore_cancel": True, "ignore_eof": True, "ignore_sigterm": True}, "sigkill"),
])
async def test_the_ladder_reaches_each_rung_for_forked_children(root, events, flags, rung):
    with trio.fail_after(40):
        async with root(fork_server=True) as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True, flags=flags))
            await sup.wait_ready("0.1")
            view = await sup.cancel(ROOT, "0.1")
    assert view.status == "cancelled"
    assert events.named("subagent.exit", handle="0.1")[0]["rung"] == rung


async def test_failures_are_reported_for_forked_children(root):
    with trio.fail_after(40):
        async with root(fork_server=True) as sup:
            crash = await sup.spawn(ROOT, req(["crash", 5]))
            assert crash.status == "failed" and "status 5" in crash.result["error"]
            garbage = await sup.spawn(ROOT, req(["garbage"]))
            assert "bad frame" in garbage.result["error"]
            await sup.spawn(ROOT, req(["hang"], async_=True))
            os.kill((await sup.wait_ready("0.3")).pid, signal.SIGKILL)
            killed = await sup.await_(ROOT, "0.3")
            assert "killed by signal 9" in killed.result["error"]


async def test_losing_the_fork_server_fails_its_children_and_the_next_spawn_starts_a_new_one(root):
    with trio.fail_after(40):
        async with root(fork_server=True) as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True))
            await sup.wait_ready("0.1")
            server_pid = sup.statistics().fork_server_pid
            os.kill(server_pid, signal.SIGKILL)
            gone = await sup.await_(ROOT, "0.1")
            assert gone.status == "failed"
            assert (await sup.wait_until(lambda s: s.fork_server_pid is None)).fork_server_pid is None
            after = await sup.spawn(ROOT, req(["result", "still spawning"]))
            assert after.result == "still spawning"
            assert not isinstance(after, Refusal)
            assert sup.statistics().fork_server_pid not in (None, server_pid)
