"""Durable runs with real processes: agentd journals a once run under ``--state-dir``, is SIGKILLed at a point
of a non-idempotent tool call, and a restart with the same state dir and ``--run-id`` finishes the run with the
tool executed at most once (an idempotent tool's lost call is sent again). The journal stays readable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.journal.sqlite import JournalFile, db_path
from tests.durable.daemons import wait_until
from tests.durable.peer import CountingPeer, counting_peer
from tests.peers.gateway import Rule, ScriptedGateway, scripted_gateway, text, tool_call
from tests.waiting import until

ROOT = str(Path(__file__).resolve().parents[2])
RUN = "pay-1"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENT")}


def _argv(gw: ScriptedGateway, peer: CountingPeer, state_dir: Path | None, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "agentd", "--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp",
            "--instruction", "Charge the card for order 7.", "--run-id", RUN, "--deadline", "60s", *extra]
    return argv + (["--state-dir", str(state_dir)] if state_dir is not None else [])


def _kinds(state_dir: Path) -> list[str]:
    path = db_path(str(state_dir))
    if not os.path.exists(path):
        return []
    try:
        journal = JournalFile(path, readonly=True)
    except Exception:
        return []
    try:
        _, rows = journal.read_raw(RUN)
        return [kind for _, _, kind, _ in rows]
    finally:
        journal.close()


async def _run(argv: Sequence[str]) -> tuple[int, dict[str, Any], str]:
    with trio.fail_after(90):
        done = await trio.run_process(list(argv), capture_stdout=True, capture_stderr=True, check=False,
                                      env=_env(), cwd=ROOT)
    out = done.stdout.decode()
    return done.returncode, json.loads(out) if out.strip() else {}, done.stderr.decode()


async def _start_and_kill(argv: Sequence[str], ready: Any, tmp_path: Path) -> None:
    """Start agentd, wait until ``ready()`` holds, SIGKILL it."""
    with open(tmp_path / "killed.stderr", "wb") as err:
        proc = await trio.lowlevel.open_process(list(argv), stdout=subprocess.DEVNULL, stderr=err, env=_env(),
                                                cwd=ROOT)
        try:
            await wait_until(proc, tmp_path / "killed.stderr", ready)
        finally:
            proc.send_signal(signal.SIGKILL)
            with trio.fail_after(10):
                await proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _last_tool_text(gw: ScriptedGateway) -> str:
    messages = gw.requests[-1].messages
    return str(messages[-1].get("content")) if messages and messages[-1].get("role") == "tool" else ""


def _rules(hold_next_reply: trio.Event | None) -> list[Rule]:
    rules = []
    if hold_next_reply is not None:  # the model's answer to the observation hangs once (killed while waiting)
        rules.append(Rule({"last_role": "tool"}, {"content": "never", "wait": hold_next_reply}, 1))
    rules.append(Rule({"last_role": "tool"}, text("order 7 is settled")))
    return rules


CASES: Mapping[str, tuple[str, str, int]] = {
    # point: (tool, hold, executions expected in the end)
    "reply_committed_call_not_executed": ("charge", "before", 0),
    "mid_call_executed": ("charge", "after", 1),
    "after_outcome": ("charge", "none", 1),
    "idempotent_mid_call_is_resent": ("lookup", "after", 2),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_sigkill_then_restart_finishes_the_run_and_never_repeats_a_non_idempotent_call(tmp_path, case):
    tool, hold, expected = CASES[case]
    state = tmp_path / "state"
    hold_reply = trio.Event() if hold == "none" else None
    async with counting_peer() as peer, scripted_gateway(
        rules=_rules(hold_reply), default=tool_call(f"pay__{tool}", {"key": "order-7", "hold": hold}),
    ) as gw:
        argv = _argv(gw, peer, state)

        def ready() -> bool:
            kinds = _kinds(state)
            if hold == "before":
                return bool(peer.received) and "tool.requested" in kinds
            if hold == "after":
                return peer.count(tool) == 1
            return "tool.outcome" in kinds and len(gw.requests) == 2

        await _start_and_kill(argv, ready, tmp_path)
        assert "run.ended" not in _kinds(state)
        requests_before = len(gw.requests)

        code, result, stderr = await _run(argv)
        assert code == 0, stderr[-3000:]
        assert result["status"] == "completed" and result["result"] == "order 7 is settled"
        assert peer.count(tool) == expected
        assert '"run.resumed"' in stderr
        # the model was asked once more, with the lost call settled: re-sent, unknown, or the real outcome
        assert len(gw.requests) == requests_before + 1
        observation = _last_tool_text(gw)
        if tool == "lookup":
            assert "done (execution #2)" in observation
        elif hold == "none":
            assert "done (execution #1)" in observation
        else:
            assert "may or may not have run" in observation

        kinds = _kinds(state)
        assert kinds[0] == "run.started" and kinds[-1] == "run.ended"
        assert kinds.count("model.reply") == 2 and kinds.count("tool.outcome") == 1

        shown = await trio.run_process([sys.executable, "-m", "agentd", "journal", "show", RUN,
                                        "--state-dir", str(state)], capture_stdout=True, capture_stderr=True,
                                       env=_env(), cwd=ROOT)
        doc = json.loads(shown.stdout)
        assert json.dumps(doc).count("run.ended") == 1

        # A third start with the same run id runs nothing: the recorded result is the answer.
        code, again, stderr = await _run(argv)
        assert code == 0 and again["result"] == "order 7 is settled" and '"run.replayed"' in stderr
        assert len(gw.requests) == requests_before + 1 and peer.count(tool) == expected


async def test_a_run_id_with_another_instruction_is_refused(tmp_path):
    state = tmp_path / "state"
    async with counting_peer() as peer, scripted_gateway(default=text("fine")) as gw:
        code, result, _ = await _run(_argv(gw, peer, state))
        assert code == 0 and result["result"] == "fine"
        other = _argv(gw, peer, state)
        other[other.index("--instruction") + 1] = "Something else."
        done = await trio.run_process(other, capture_stdout=True, capture_stderr=True, check=False, env=_env(),
                                      cwd=ROOT)
        assert done.returncode == 2 and b"another instruction" in done.stderr
        assert len(gw.requests) == 1


async def test_without_a_state_dir_nothing_is_written(tmp_path):
    async with counting_peer() as peer, scripted_gateway(default=text("fine")) as gw:
        code, result, stderr = await _run(_argv(gw, peer, None))
    assert code == 0 and result["result"] == "fine"
    assert '"journal.opened"' not in stderr and list(tmp_path.iterdir()) == []


async def test_a_sigterm_drained_run_resumes_with_the_same_run_id(tmp_path):
    state = tmp_path / "state"
    hold_reply = trio.Event()
    async with counting_peer() as peer, scripted_gateway(
        rules=_rules(hold_reply), default=tool_call("pay__charge", {"key": "order-7", "hold": "none"}),
    ) as gw:
        argv = _argv(gw, peer, state, "--drain-timeout", "500ms")
        with open(tmp_path / "drained.stderr", "wb") as err:
            proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=err, env=_env(), cwd=ROOT)
            try:
                await until(lambda: "tool.outcome" in _kinds(state) and len(gw.requests) == 2, timeout=60,
                            what="the tool's outcome and the second model request")
                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(30):
                    await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        assert proc.returncode != -signal.SIGKILL
        assert "run.ended" not in _kinds(state)  # drained: left unfinished on purpose

        code, result, stderr = await _run(argv)
        assert code == 0 and result["result"] == "order 7 is settled", stderr[-3000:]
        assert peer.count("charge") == 1 and "done (execution #1)" in _last_tool_text(gw)


async def test_daemon_wakes_are_journaled_and_numbered_after_an_earlier_process(tmp_path):
    state = tmp_path / "state"
    async with counting_peer() as peer, scripted_gateway(default=text("tick done")) as gw:
        argv = _argv(gw, peer, state, "--mode", "loop", "--interval", "0", "--budget-tokens-lifetime", "20")
        code, _, stderr = await _run(argv)
        assert code == 7, stderr[-3000:]  # the lifetime budget ends the loop after two wakes of 15 tokens
        code, _, stderr = await _run(argv)
        assert code == 7, stderr[-3000:]
    journal = JournalFile(db_path(str(state)), readonly=True)
    try:
        wakes = {s.run_id: s.status for s in journal.list_runs(50, None)}
    finally:
        journal.close()
    assert wakes == {f"{RUN}.1": "completed", f"{RUN}.2": "completed", f"{RUN}.3": "completed",
                     f"{RUN}.4": "completed"}


async def test_an_unusable_state_dir_is_a_config_error(tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    async with counting_peer() as peer, scripted_gateway(default=text("fine")) as gw:
        done = await trio.run_process(_argv(gw, peer, tmp_path / "a-file" / "state"), capture_stdout=True,
                                      capture_stderr=True, check=False, env=_env(), cwd=ROOT)
        assert done.returncode == 2 and b"--state-dir" in done.stderr, done.stderr[-2000:]
        assert gw.requests == []
