"""Which commits of a tree's subagents are flushed (docs/durability.md, "fsync policy"), read from the journal file
that real agentd processes wrote: a trigger notes the ``synchronous`` setting of the connection that wrote each row.

A subagent of a run (``subagent.spawn``, a ``graph.run`` node) hands its end to that run, which commits it as the
call's outcome and acts outside agentd only after a flush of its own: the child's ``run.ended`` is written
without one, and the parent's next flush (here its own ``run.ended``) comes after it in the log. A child's step
that calls a tool is flushed before the call, as the root's; its final answer is committed with its end, in
one transaction. A served spawn's end is handed to a client: flushed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.journal.sqlite import DB_NAME
from tests.ctl.daemon import daemon
from tests.durable.peer import counting_peer
from tests.durable.test_served_restart import _client, _structured
from tests.integration.agents import agentd_worker, text_of
from tests.journal.noting import FULL, NORMAL, noting_journal
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.waiting import until

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]


def _times(state: Path, run: str) -> list[tuple[str, float]]:
    with sqlite3.connect(state / DB_NAME) as conn:
        return [(k, t) for k, t in conn.execute("SELECT kind, ts FROM entries WHERE run_id = ? ORDER BY seq", (run,))]


def _seen(state: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(state / DB_NAME) as conn:
        return [(r, k, s) for r, k, s in conn.execute("SELECT run_id, kind, sync FROM seen ORDER BY rowid")]


async def test_a_run_s_subagents_end_unflushed_and_the_parent_s_flush_comes_after(tmp_path: Path) -> None:
    state = tmp_path / "state"
    await noting_journal(state)

    def reply(request: RecordedRequest) -> dict[str, Any]:
        said = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
        observed = sum(1 for m in request.messages if m.get("role") == "tool")
        if "CHARGER" in said:
            return tool_call("pay__charge", {"key": "order-1"}) if observed == 0 else text("charged")
        if "NODE" in said:
            return text("node done")
        if observed == 0:
            return tool_call("subagent_spawn", {"instruction": "CHARGER: charge order 1"})
        if observed == 1:
            return tool_call("graph_run", {"nodes": [{"id": "a", "instruction": "NODE a"}]})
        return text("all done")

    async with counting_peer() as peer, scripted_gateway(default=reply) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--instruction", "ROOT: delegate",
                "--run-id", "root", "--state-dir", str(state), "--deadline", "120s"]
        async with daemon(argv, tmp_path, "tree") as d:
            code, result = await d.wait(timeout=90)
    assert code == 0 and result["result"] == "all done", d.stderr.read_text()[-3000:]
    assert peer.count("charge") == 1
    seen = _seen(state)
    children = sorted({run for run, _, _ in seen if run != "root"})
    assert len(children) == 2, seen  # the spawned child's run and the graph node's
    for child in children:
        rows = [(i, kind, sync) for i, (run, kind, sync) in enumerate(seen) if run == child]
        ends = [(i, sync) for i, kind, sync in rows if kind == "run.ended"]
        assert [sync for _, sync in ends] == [NORMAL], rows  # not flushed: the root commits it
        root_flush = [i for i, (run, kind, sync) in enumerate(seen) if run == "root" and sync == FULL]
        assert root_flush and root_flush[-1] > ends[0][0], seen  # the root's own flush secures it
        # its final answer goes in the same transaction as its end (one clock reading per transaction)
        times = _times(state, child)
        end = times[-1][1]
        assert times[-3:] == [("model.reply", end), ("usage", end), ("run.ended", end)], times
        assert all(t < end for kind, t in times[:-3] if kind != "run.started"), times  # (a new run's start: with
        # its first commit, here the node's only one)
    charger = next(c for c in children if any(kind == "tool.requested" for run, kind, _ in seen if run == c))
    assert {sync for run, kind, sync in seen if run == charger and kind == "tool.requested"} == {FULL}
    assert [sync for run, kind, sync in seen if run == "root" and kind == "run.ended"] == [FULL]


async def test_a_served_spawn_s_end_is_flushed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    await noting_journal(state)
    async with scripted_gateway(default=lambda request: text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0", "--intelligence", gw.url, "--state-dir", str(state),
                "--drain-timeout", "3", "--cancel-grace", "1"]
        async with agentd_worker(argv) as worker:
            with trio.fail_after(60):
                async with _client(worker) as pool:
                    spawned = await _structured(pool, "subagent.spawn", {"instruction": "say fine", "async": True})

                    async def ended() -> dict[str, Any] | None:
                        view = await _structured(pool, "subagent.status", {"handle": spawned["handle"]})
                        return view if view["done"] else None

                    view = await until(ended, timeout=60, what="the served run's end")
    assert view["status"] == "completed" and view["result"] == "fine", view
    ends = [(run, sync) for run, kind, sync in _seen(state) if kind == "run.ended"]
    assert len(ends) == 1 and ends[0][1] == FULL, ends
