"""Every ``tools/call`` carries an idempotency key in ``_meta`` (docs/mcp-client.md, "Idempotency keys"): present
on every call, distinct for every other call (in one run, in a later run under the same ``--run-id``, in another
manifest step, in the turns of one warm subagent), the same on every re-send of one call: after the server forgot
the session, and after a SIGKILL and a restart from the journal. ``params.idempotencyKey`` only for a server that
declares the field.

Real parts: agentd (in process, and as a process for the crash and the subagents), the counting MCP peer over
HTTP (it records each call's ``_meta``), the scripted gateway."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import agentd
from agentd.telemetry.events import EventLog
from tests.connections.helpers import connection, run
from tests.durable.peer import CountingPeer, counting_peer
from tests.durable.test_crash_resume import RUN, _argv, _kinds, _rules, _run, _start_and_kill
from tests.integration.agents import text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call, tool_calls

KEY = "io.modelcontextprotocol/idempotency-key"
RUN_ID = "io.modelcontextprotocol/run-id"


def _keys(peer: CountingPeer) -> list[str]:
    keys = [call["meta"][KEY] for call in peer.received]
    assert all(isinstance(k, str) and k for k in keys), peer.received
    return keys


async def _once(peer: CountingPeer, script: list[dict[str, Any]], *extra: str) -> agentd.RunResult:
    async with scripted_gateway(script) as gw:
        cfg = agentd.load_config(["--instruction", "Settle order 7.", "--intelligence", gw.url,
                                       "--mcp", f"pay={peer.origin}/mcp", *extra], env={})
        with trio.fail_after(30):
            result = await agentd.main(cfg, log=EventLog(sink=lambda line: None))
    assert result.status is agentd.RunStatus.COMPLETED, result
    return result


async def test_every_call_has_its_own_key_and_a_later_run_under_the_same_run_id_new_ones() -> None:
    async with counting_peer() as peer:
        first = [tool_calls(("pay__lookup", {"key": "a"}), ("pay__lookup", {"key": "a"})),
                 tool_call("pay__lookup", {"key": "a"}), text("done")]
        await _once(peer, first, "--run-id", "same")
        await _once(peer, [tool_call("pay__lookup", {"key": "a"}), text("done")], "--run-id", "same")
        await _once(peer, [tool_call("pay__lookup", {"key": "a"}), text("done")])
    keys = _keys(peer)
    assert len(keys) == 5 and len(set(keys)) == 5  # three in the first run, one in each later run
    assert [call["meta"][RUN_ID] for call in peer.received][:4] == ["same"] * 4
    # Not declared by the server: no standard field.
    assert all(call["field"] is None for call in peer.received)


async def test_a_call_sent_again_after_the_server_forgot_the_session_keeps_its_key() -> None:
    async with counting_peer(forget_first_call=True) as peer:
        await _once(peer, [tool_call("pay__charge", {"key": "order-7"}), text("done")])
    assert [call["name"] for call in peer.received] == ["charge", "charge"] and peer.count("charge") == 1
    first, again = _keys(peer)
    assert first == again


async def test_the_standard_field_is_sent_when_the_server_declares_it() -> None:
    async with counting_peer(idempotency=True) as peer:
        await _once(peer, [tool_calls(("pay__lookup", {"key": "a"}), ("pay__charge", {"key": "b"})), text("done")])
    keys = _keys(peer)
    assert [call["field"] for call in peer.received] == keys and len(set(keys)) == 2


async def test_manifest_steps_of_one_run_name_their_calls_apart(tmp_path: Path) -> None:
    script = [tool_call("pay__lookup", {"key": "a"}), text("one"), tool_call("pay__lookup", {"key": "a"}), text("two")]
    async with counting_peer() as peer, scripted_gateway(script) as gw:
        host = {"intelligence": {"url": gw.url},
                "connections": {"pay": connection(f"{peer.origin}/mcp", tools=["lookup"], readTools=["lookup"])},
                "transcript": {"enabled": False}}
        manifest = {"connections": [{"ref": "pay"}],
                    "steps": [{"id": "one", "prompt": "p1", "tools": ["pay__lookup"]},
                              {"id": "two", "prompt": "p2", "tools": ["pay__lookup"]}]}
        with trio.fail_after(30):
            outcome = await run(tmp_path, host, manifest)
    assert outcome.code == 0, outcome.raw
    first, second = _keys(peer)  # same run id, both the first call of their step's loop
    assert first != second


async def test_an_idempotent_call_resent_after_a_sigkill_carries_the_key_it_was_first_sent_with(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with counting_peer(idempotency=True) as peer, scripted_gateway(
        rules=_rules(None), default=tool_call("pay__lookup", {"key": "order-7", "hold": "after"}),
    ) as gw:
        argv = _argv(gw, peer, state)
        await _start_and_kill(argv, lambda: peer.count("lookup") == 1, tmp_path)
        assert "run.ended" not in _kinds(state)
        code, result, stderr = await _run(argv)
        assert code == 0 and result["result"] == "order 7 is settled", stderr[-3000:]
    assert peer.count("lookup") == 2 and '"run.resumed"' in stderr
    first, again = _keys(peer)
    assert first == again and [call["field"] for call in peer.received] == [first, again]
    assert all(call["meta"][RUN_ID] == RUN for call in peer.received)


@pytest.mark.usefixtures("no_leftover_children")
async def test_a_warm_subagents_turns_and_its_parent_name_the_same_call_apart(tmp_path: Path) -> None:
    # The child's turns run under one run id (RUN/<handle>): each turn's keys are still its own.
    def reply(request: RecordedRequest) -> dict[str, Any]:
        said = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
        last = request.messages[-1] if request.messages else {}
        if "CHILD" in said:
            return text("looked") if last.get("role") == "tool" else tool_call("pay__lookup", {"key": "a"})
        observed = [m for m in request.messages if m.get("role") == "tool"]
        if not observed:
            return tool_call("pay__lookup", {"key": "a"})
        if len(observed) == 1:
            return tool_call("subagent_spawn", {"instruction": "CHILD: look a up", "warm": True})
        if len(observed) == 2:
            handle = json.loads(text_of(observed[-1].get("content")))["handle"]
            return tool_call("subagent_send", {"handle": handle, "message": "CHILD: and again"})
        return text("done")

    async with counting_peer() as peer, scripted_gateway(default=reply) as gw:
        argv = [sys.executable, "-m", "agentd", "--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp",
                "--instruction", "PARENT: look, then delegate", "--run-id", "warm-1", "--deadline", "120s"]
        code, result, stderr = await _run(argv)
    assert code == 0 and result["result"] == "done", stderr[-3000:]
    keys = _keys(peer)
    run_ids = [call["meta"][RUN_ID] for call in peer.received]
    assert run_ids[0] == "warm-1" and run_ids[1] == run_ids[2] != "warm-1" and run_ids[1].startswith("warm-1/")
    assert len(keys) == 3 and len(set(keys)) == 3
