"""A pending approval moves with the work in a cluster: two agentd members (each with its own control socket)
against a real PostgreSQL; the member that holds a call waiting for approval is SIGKILLed; the member that takes
the item over resumes it from the shared journal and asks again, and the call is sent once, only when approved
there."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from agentd.cluster.store import open_pg_journal
from agentd.cluster.work import enqueue
from tests.cluster.test_members import (
    ROOT,
    _env,
    _is_done,
    _joined,
    _member_argv,
    _owners,
    _pid_of,
    _wait_for,
)
from tests.ctl.daemon import ctl
from tests.durable.peer import counting_peer
from tests.peers.gateway import Rule, scripted_gateway, text, tool_call
from tests.postgres import PASSWORD
from tests.waiting import until


@asynccontextmanager
async def _two_members(argv: list[str], tmp_path: Path) -> AsyncIterator[list[tuple[trio.Process, str]]]:
    """Two members, each with its own ``--ctl-socket``; SIGKILLed at the end of the block."""
    members: list[tuple[trio.Process, str]] = []
    logs = []
    try:
        for i in range(2):
            sock = str(tmp_path / f"m{i}.sock")
            log = open(tmp_path / f"member{i}.stderr", "wb")
            logs.append(log)
            proc = await trio.lowlevel.open_process([*argv, "--ctl-socket", sock], stdout=subprocess.DEVNULL,
                                                    stderr=log, env=_env(), cwd=ROOT)
            members.append((proc, sock))
        for i in range(2):
            await until(lambda i=i: _joined(members[i][0], tmp_path / f"member{i}.stderr"), timeout=60,
                        what=f"member{i} joined")
        yield members
    finally:
        for proc, _ in members:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            with trio.move_on_after(10):
                await proc.wait()
        for log in logs:
            log.close()


async def _pending(sock: str) -> list[dict[str, Any]]:
    code, doc = await ctl("approvals", "--socket", sock)
    return list(doc["approvals"]) if code == 0 else []


async def test_the_member_taking_over_asks_again_and_sends_only_when_approved(pg_dsn, tmp_path):
    async with counting_peer() as peer, scripted_gateway(
        rules=[Rule({"last_role": "tool"}, text("charged"))], default=tool_call("pay__charge", {"key": "order-9"}),
    ) as gw, open_pg_journal(pg_dsn, PASSWORD) as store:
        # a lease longer than the suite's 3 s: the owner waits for a person, and a loaded machine must not let its
        # lease lapse meanwhile (a lapsed one is taken over too, which this test does not mean to show)
        argv = [*_member_argv(pg_dsn, gw, peer, ttl=10), "--approve", "pay__charge"]
        async with _two_members(argv, tmp_path) as members:
            await enqueue(store, "job-a", "run", {"instruction": "charge order 9"})
            [first] = await _wait_for(lambda: _owners(store, "job-a"))
            owner = next(m for m in members if m[0].pid == _pid_of(first))
            other = next(m for m in members if m is not owner)
            [item] = await _wait_for(lambda: _pending(owner[1]))
            assert item["run_id"] == "job-a" and item["tool"] == "pay__charge"
            owner[0].send_signal(signal.SIGKILL)

            [again] = await _wait_for(lambda: _pending(other[1]), 90)  # past the lease: taken over, asked again
            assert again["run_id"] == "job-a" and peer.received == []
            code, _ = await ctl("approve", str(again["id"]), "--socket", other[1])
            assert code == 0
            await _wait_for(lambda: _is_done(store, "job-a"), 90)
        owners = await _owners(store, "job-a")
    assert len(owners) == 2 and owners[1] != first
    assert peer.count("charge") == 1 and len(peer.received) == 1
