"""A ``--continue`` turn in flight at a SIGKILL is resumed by the restarted daemon (same ``--run-id`` and
``--state-dir``) with the whole conversation: the session's earlier turns, the interrupted turn's wake message and
its committed steps, each exactly once; and the session goes on from there for the next update.

Real parts: the agentd CLI as a daemon process, the official-SDK MCP server (its ``test://counter`` resource is
bumped through its side door, its ``slow`` tool holds the second turn), the scripted gateway recording every
request body."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from agentd.journal.sqlite import JournalFile, db_path
from tests.durable.daemons import daemon, wait_until
from tests.integration.agents import text_of
from tests.peers import launch
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]

RUN = "counter-log"
COUNTER = "test://counter"
INSTRUCTION = "Keep a log of the counter."


def _kinds(state: Path) -> dict[str, list[str]]:
    """Each journaled run's record kinds, in commit order."""
    if not os.path.exists(db_path(str(state))):
        return {}
    journal = JournalFile(db_path(str(state)), readonly=True)
    try:
        return {s.run_id: [kind for _, _, kind, _ in journal.read_raw(s.run_id)[1]] for s in journal.list_runs(50, None)}
    finally:
        journal.close()


def _contents(message: dict[str, Any]) -> str:
    """The resource contents a wake message carries (between ``<resource ...>`` and ``</resource>``)."""
    said = text_of(message.get("content"))
    return said.split("<resource", 1)[1].split(">", 1)[1].split("</resource>", 1)[0].strip() if "<resource" in said \
        else ""


def _conversation(request: RecordedRequest) -> list[tuple[str, str]]:
    """A request's messages after the system prompt, as ``(role, what)``: a wake message by the counter value it
    carries, a reply by its text or its tool calls, an observation by its call id."""
    shown = []
    for m in request.messages:
        if m["role"] == "user":
            shown.append(("user", f"counter={_contents(m)}"))
        elif m["role"] == "assistant":
            calls = [c["function"]["name"] for c in m.get("tool_calls") or ()]
            shown.append(("assistant", ",".join(calls) if calls else text_of(m.get("content"))))
        elif m["role"] == "tool":
            shown.append(("tool", str(m.get("tool_call_id"))))
    return shown


async def test_a_continue_turn_in_flight_at_sigkill_resumes_with_the_sessions_earlier_turns(tmp_path):
    state = tmp_path / "state"
    held: list[bool] = []

    def reply(request: RecordedRequest) -> dict[str, Any]:
        last = request.messages[-1]
        if last["role"] == "tool":
            return text("counter 2 logged after the slow call")
        value = _contents(last)
        if value == "2" and not held:  # the second turn: its call hangs at the server, the daemon is killed
            held.append(True)
            return tool_call("srv__slow", {"seconds": 3600}, id="call_slow")
        return text(f"counter {value} logged")

    async with launch.peer_server(launch.sdk_server_argv()) as peer, scripted_gateway(default=reply) as gw:
        argv = [sys.executable, "-m", "agentd", "--mode", "reactive", "--continue", COUNTER, "--debounce", "50ms",
                "--intelligence", gw.url, "--mcp", f"srv={peer.url}", "--instruction", INSTRUCTION,
                "--run-id", RUN, "--state-dir", str(state), "--log-level", "info"]
        first, second, third_log = (tmp_path / f"{n}.stderr" for n in (1, 2, 3))
        async with daemon(argv, first) as proc:
            await wait_until(proc, first, lambda: '"trigger.armed"' in first.read_text())
            assert await launch.abump(peer.url) == 1
            await wait_until(proc, first, lambda: _kinds(state).get(f"{RUN}.1", [])[-1:] == ["run.ended"])
            assert await launch.abump(peer.url) == 2
            # The second turn's reply (its slow call) is committed and the call sent: killed while it waits.
            await wait_until(proc, first, lambda: "tool.requested" in _kinds(state).get(f"{RUN}.2", [])
                             and launch.stats(peer.url)["requests"].get("tools/call", 0) == 1)
        before = len(gw.requests)
        assert before == 2

        async with daemon(argv, second) as proc:
            await wait_until(proc, second, lambda: _kinds(state).get(f"{RUN}.2", [])[-1:] == ["run.ended"])
            await wait_until(proc, second, lambda: '"trigger.armed"' in second.read_text())
            assert await launch.abump(peer.url) == 3
            await wait_until(proc, second, lambda: _kinds(state).get(f"{RUN}.3", [])[-1:] == ["run.ended"])

        # Killed between turns: the next daemon's session still holds all three.
        async with daemon(argv, third_log) as proc:
            await wait_until(proc, third_log, lambda: '"trigger.armed"' in third_log.read_text())
            assert await launch.abump(peer.url) == 4
            await wait_until(proc, third_log, lambda: _kinds(state).get(f"{RUN}.4", [])[-1:] == ["run.ended"])

    resumed, third, fourth = gw.requests[before:]
    first_turn = [("user", "counter=1"), ("assistant", "counter 1 logged")]
    assert _conversation(resumed) == [
        *first_turn, ("user", "counter=2"), ("assistant", "srv__slow"), ("tool", "call_slow")]
    assert "may or may not have run" in text_of(resumed.messages[-1].get("content"))  # the lost call's outcome
    assert INSTRUCTION in text_of(resumed.messages[1]["content"])  # the session's first turn carries it, once
    assert sum(INSTRUCTION in text_of(m.get("content")) for m in resumed.messages[1:]) == 1
    # The session goes on: the next update's turn carries both earlier turns (the resumed one by its answer).
    assert _conversation(third) == [
        *first_turn, ("user", "counter=2"), ("assistant", "counter 2 logged after the slow call"),
        ("user", "counter=3")]
    assert '"trigger":"resume"' in second.read_text().replace(" ", "")
    assert _conversation(fourth) == [*_conversation(third), ("assistant", "counter 3 logged"), ("user", "counter=4")]
    assert set(_kinds(state)) == {f"{RUN}.{n}" for n in range(1, 5)}  # one run per turn, none run twice
