"""A daemon wake in flight at a SIGKILL is resumed by the restarted daemon (same ``--run-id``, ``--state-dir``)
from its last committed step, like a once run: its non-idempotent tool call whose outcome was lost is not sent
again (the model is told the outcome is unknown), and the wake ends under its own run id."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.journal.sqlite import JournalFile, db_path
from tests.durable.daemons import daemon_until
from tests.durable.peer import counting_peer
from tests.integration.agents import text_of
from tests.peers.gateway import RecordedRequest, Rule, scripted_gateway, text, tool_call

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]

RUN = "ticker"



def _statuses(state: Path) -> dict[str, str]:
    if not os.path.exists(db_path(str(state))):
        return {}
    journal = JournalFile(db_path(str(state)), readonly=True)
    try:
        return {s.run_id: s.status for s in journal.list_runs(50, None) if "/" not in s.run_id}  # not children
    finally:
        journal.close()




async def test_a_wake_in_flight_at_sigkill_is_resumed_and_its_lost_call_is_not_resent(tmp_path):
    state = tmp_path / "state"
    charge = tool_call("pay__charge", {"key": "order-7", "hold": "after"})  # executes, then hangs
    rules = [Rule({"last_role": "tool"}, text("order 7 is settled")), Rule({"last_role": "user"}, charge, 1)]
    async with counting_peer() as peer, scripted_gateway(rules=rules, default=text("nothing to do")) as gw:
        argv = [sys.executable, "-m", "agentd", "--mode", "loop", "--interval", "1h", "--intelligence", gw.url,
                "--mcp", f"pay={peer.origin}/mcp", "--instruction", "Settle what is due.", "--run-id", RUN,
                "--state-dir", str(state), "--log-level", "info"]
        await daemon_until(argv, tmp_path / "1.stderr", lambda: peer.count("charge") == 1)
        assert _statuses(state) == {f"{RUN}.1": "running"}

        await daemon_until(argv, tmp_path / "2.stderr", lambda: _statuses(state) == {
            f"{RUN}.1": "completed", f"{RUN}.2": "completed"})
        assert peer.count("charge") == 1  # the lost call was not sent again
        resumed = [r for r in gw.requests if r.messages and r.messages[-1].get("role") == "tool"]
        assert len(resumed) == 1 and "may or may not have run" in str(resumed[0].messages[-1].get("content"))
        stderr = (tmp_path / "2.stderr").read_text()
        assert '"run.resumed"' in stderr and '"trigger":"resume"' in stderr.replace(" ", "")

    journal = JournalFile(db_path(str(state)), readonly=True)
    try:
        _, rows = journal.read_raw(f"{RUN}.1")
    finally:
        journal.close()
    kinds = [kind for _, _, kind, _ in rows]
    assert kinds.count("run.started") == 1 and kinds[-1] == "run.ended" and kinds.count("tool.outcome") == 1


async def test_a_resumed_wakes_child_handle_is_not_given_to_a_new_wakes_child(tmp_path):
    state = tmp_path / "state"
    hold, held, fresh = trio.Event(), [], []

    def reply(request: RecordedRequest) -> dict[str, Any]:
        said = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
        if "SLOW-CHILD" in said:
            return text("never", wait=hold)  # the child hangs in its model call
        if "QUICK" in said:
            return text("quick done")
        if not any(m.get("role") == "tool" for m in request.messages):
            fresh.append(True)
            if len(fresh) == 1:  # the first wake, first process
                return tool_call("subagent_spawn", {"instruction": "SLOW-CHILD: wait", "async": True})
            return tool_call("subagent_spawn", {"instruction": "QUICK: say done"})  # the new wake, restarted
        if not held:
            held.append(True)
            return text("never", wait=hold)  # the first wake's next reply hangs: killed here
        return text("done")

    async with counting_peer() as peer, scripted_gateway(default=reply) as gw:
        argv = [sys.executable, "-m", "agentd", "--mode", "loop", "--interval", "1h", "--intelligence", gw.url,
                "--mcp", f"pay={peer.origin}/mcp", "--instruction", "Delegate what is due.", "--run-id", RUN,
                "--state-dir", str(state)]
        await daemon_until(argv, tmp_path / "1.stderr", lambda: bool(held) and any(
            "SLOW-CHILD" in text_of(m.get("content")) for r in gw.requests for m in r.messages
            if m.get("role") == "user"))
        await daemon_until(argv, tmp_path / "2.stderr", lambda: _statuses(state) == {
            f"{RUN}.1": "completed", f"{RUN}.2": "completed"})
        del peer

    def children(run_id: str) -> list[tuple[str, str, str]]:
        journal = JournalFile(db_path(str(state)), readonly=True)
        try:
            _, rows = journal.read_raw(run_id)
        finally:
            journal.close()
        records = [(kind, json.loads(body)) for _, _, kind, body in rows]
        return [(kind, r["handle"], r.get("status", "")) for kind, r in records if kind in ("spawn", "child.result")]

    # the resumed wake's async child resumed under its handle (the wake ended without awaiting it)
    assert children(f"{RUN}.1") == [("spawn", "0.1", "")]
    assert '"event": "subagent.resumed"' in (tmp_path / "2.stderr").read_text()
    assert children(f"{RUN}.2") == [("spawn", "0.2", ""), ("child.result", "0.2", "completed")]
