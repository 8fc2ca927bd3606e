"""Durable daemon state with real processes: a subscription the agent added with the ``subscribe`` self-tool
survives a SIGKILL; the restarted daemon re-subscribes and reads after subscribing, so a change made while
it was down wakes it, and no change does not."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from agentd.journal.sqlite import JournalFile, db_path
from agentd.modes.runs import SELF_SUBSCRIPTIONS
from tests.durable.daemons import daemon_until
from tests.peers import launch
from tests.peers.gateway import Rule, scripted_gateway, text, tool_call

pytestmark = pytest.mark.interop

COUNTER = "test://counter"



def _kept(state: Path) -> dict[str, object]:
    if not os.path.exists(db_path(str(state))):
        return {}
    journal = JournalFile(db_path(str(state)), readonly=True)
    try:
        return journal.get_state(SELF_SUBSCRIPTIONS)
    finally:
        journal.close()


def _restored(stderr: Path) -> dict[str, object] | None:
    for line in stderr.read_text().splitlines():
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("event") == "mcp.subscribe" and event.get("restored"):
            return event
    return None




async def test_a_self_subscription_survives_a_crash_and_a_missed_change_wakes(tmp_path):
    state = tmp_path / "state"
    rules = [Rule({"last_role": "tool"}, text("subscribed")),
             Rule({"last_contains": COUNTER, "last_role": "user"}, text("woke on the counter"))]
    async with (
        scripted_gateway(rules=rules, default=tool_call("subscribe", {"uri": COUNTER})) as gw,
        launch.peer_server(launch.sdk_server_argv()) as peer,
    ):
        argv = [sys.executable, "-m", "agentd", "--mode", "loop", "--interval", "1h", "--intelligence", gw.url,
                "--mcp", f"srv={peer.url}", "--instruction", "Keep an eye on things.", "--run-id", "watcher",
                "--state-dir", str(state), "--log-level", "info"]

        def woke() -> bool:
            return any(r.messages and r.messages[-1].get("role") == "user"
                       and COUNTER in str(r.messages[-1].get("content")) for r in gw.requests)

        await daemon_until(argv, tmp_path / "1.stderr", lambda: COUNTER in _kept(state))
        assert not woke()
        assert await launch.abump(peer.url) == 1  # changed while the daemon is down

        await daemon_until(argv, tmp_path / "2.stderr", woke)
        restored = _restored(tmp_path / "2.stderr")
        assert restored is not None and restored["uri"] == COUNTER and restored["changed"] is True

        await daemon_until(argv, tmp_path / "3.stderr", lambda: _restored(tmp_path / "3.stderr") is not None)
        restored = _restored(tmp_path / "3.stderr")
        assert restored is not None and restored["changed"] is False  # nothing missed: no wake


async def test_a_pending_self_schedule_survives_a_crash_and_fires_once(tmp_path):
    from agentd.modes.runs import SELF_SCHEDULES

    state = tmp_path / "state"
    first = {"after_seconds": 3, "instruction": "job A: send the weekly report"}
    second = {"after_seconds": 3600, "instruction": "schedule B: later"}
    rules = [Rule({"last_role": "tool"}, text("scheduled")),
             Rule({"last_contains": "job A"}, text("report sent")),
             Rule({"last_contains": "Keep an eye"}, tool_call("schedule", first), 1)]
    async with (
        scripted_gateway(rules=rules, default=tool_call("schedule", second)) as gw,
        launch.peer_server(launch.sdk_server_argv()) as peer,
    ):
        argv = [sys.executable, "-m", "agentd", "--mode", "loop", "--interval", "1h", "--intelligence", gw.url,
                "--mcp", f"srv={peer.url}", "--instruction", "Keep an eye on things.", "--run-id", "sched",
                "--state-dir", str(state)]

        def pending() -> dict[str, object]:
            if not os.path.exists(db_path(str(state))):
                return {}
            journal = JournalFile(db_path(str(state)), readonly=True)
            try:
                return journal.get_state(SELF_SCHEDULES)
            finally:
                journal.close()

        def fired() -> int:
            return sum(1 for r in gw.requests if r.messages and r.messages[-1].get("role") == "user"
                       and "job A" in str(r.messages[-1].get("content")))

        await daemon_until(argv, tmp_path / "1.stderr", lambda: len(pending()) == 1)
        assert fired() == 0  # killed before it was due

        def job_a_kept() -> bool:
            return any("job A" in str(v) for v in pending().values())

        def settled() -> bool:  # killed between wakes: an unfinished one would be resumed (a model call again)
            journal = JournalFile(db_path(str(state)), readonly=True)
            try:
                return all(r.status != "running" for r in journal.list_runs(50, None))
            finally:
                journal.close()

        await daemon_until(argv, tmp_path / "2.stderr", lambda: fired() >= 1 and not job_a_kept() and settled())
        assert fired() == 1
        # forgotten once fired: a third start does not fire it again
        await daemon_until(argv, tmp_path / "3.stderr", lambda: len(
            [r for r in gw.requests if "Keep an eye" in str(r.messages[-1].get("content"))]) >= 3)
        assert fired() == 1
