"""Descriptors: an ended subagent keeps its view, never its pipes; running out of them is a clean refusal.

The fd count is this (test) process's ``/proc/self/fd``: the supervisor runs in-process here.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
from collections.abc import Iterator

import pytest
import trio

from agentd.supervisor.caps import Refusal
from tests.supervisor.conftest import ROOT, req


def open_fds() -> int:
    gc.collect()  # what garbage still holds is not what the supervisor keeps
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def no_free_descriptors() -> Iterator[None]:
    """Every descriptor number below a lowered soft limit is taken: the next ``pipe()`` fails with EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
    fillers: list[int] = []
    try:
        while True:
            try:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "re-exec"])
async def test_ended_subagents_release_their_descriptors(root, fork_server):
    with trio.fail_after(90):
        async with root(fork_server=fork_server, spawn_burst=64) as sup:
            first = await sup.spawn(ROOT, req(["echo"]))  # starts the fork server (its socket stays)
            assert first.status == "completed"
            baseline = open_fds()
            for _ in range(6):
                view = await sup.spawn(ROOT, req(["result", "x"]))
                assert view.status == "completed"
            started = [await sup.spawn(ROOT, req(["result", "y"], async_=True)) for _ in range(3)]
            for view in started:
                assert (await sup.await_(ROOT, view.handle)).status == "completed"
            crashed = await sup.spawn(ROOT, req(["crash", 3]))
            assert crashed.status == "failed"
            # Ten ended children, all still readable by handle, none holding a descriptor.
            stats = sup.statistics()
            assert len(stats.nodes) == 11 and stats.counts == {"completed": 10, "failed": 1}
            assert open_fds() == baseline


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "re-exec"])
async def test_out_of_descriptors_is_a_retryable_refusal_and_leaks_nothing(root, events, fork_server):
    with trio.fail_after(90):
        async with root(fork_server=fork_server) as sup:
            assert (await sup.spawn(ROOT, req(["echo"]))).status == "completed"
            baseline = open_fds()
            with no_free_descriptors():
                sync = await sup.spawn(ROOT, req(["echo"]))
                detached = await sup.spawn(ROOT, req(["echo"], async_=True))
            for refused in (sync, detached):
                assert isinstance(refused, Refusal), refused
                assert refused.cap == "resources" and refused.retryable
                assert "Too many open files" in refused.message
            assert open_fds() == baseline  # nothing half-taken stays open
            assert [e["cap"] for e in events.named("subagent.refused")] == ["resources", "resources"]
            stats = sup.statistics()  # the refused spawns left no node behind
            assert stats.live == () and [n.handle for n in stats.nodes] == ["0.1"]
            again = await sup.spawn(ROOT, req(["result", "fine again"]))
            assert not isinstance(again, Refusal) and again.result == "fine again"
