"""A tool call the server runs as a task is a durable wait: its task id is journaled (``tool.task``) before the
first poll, so after SIGKILL a restart with the same ``--state-dir`` and ``--run-id`` polls the same task instead of
calling the tool again. Real processes: agentd, the project's modern-only peer speaking the tasks extension
(tests/peers/servers/modern_only_server.py ``--tasks``, which counts every ``tools/call`` and keeps its tasks
across agentd's restart) and the scripted gateway."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.durable.test_crash_resume import _kinds, _last_tool_text, _run, _start_and_kill
from tests.peers import launch
from tests.peers.gateway import Rule, scripted_gateway, text, tool_call

RUN = "pay-1"  # the run id test_crash_resume's journal helpers read


@pytest.fixture
def task_peer() -> Iterator[launch.PeerProcess]:
    with launch.start_peer(launch.modern_server_argv(tasks=True)) as peer:
        yield peer


async def test_sigkill_while_a_task_runs_then_restart_polls_the_same_task(
    tmp_path: Path, task_peer: launch.PeerProcess,
) -> None:
    state = tmp_path / "state"
    async with scripted_gateway(
        rules=[Rule({"last_role": "tool"}, text("the research is in"))],
        default=tool_call("m__research", {"topic": "tides", "seconds": 2}),
    ) as gw:
        argv = [sys.executable, "-m", "agentd", "--intelligence", gw.url, "--mcp", f"m={task_peer.url}",
                "--instruction", "Research the tides.", "--run-id", RUN, "--deadline", "60s",
                "--state-dir", str(state)]
        await _start_and_kill(argv, lambda: "tool.task" in _kinds(state), tmp_path)
        kinds = _kinds(state)
        assert "tool.outcome" not in kinds and "run.ended" not in kinds
        assert launch.stats(task_peer.url)["requests"]["tools/call"] == 1

        code, result, stderr = await _run(argv)
        assert code == 0, stderr[-3000:]
        assert result["status"] == "completed" and result["result"] == "the research is in"
        assert launch.stats(task_peer.url)["requests"]["tools/call"] == 1  # never called again
        assert '"mcp.task_resumed"' in stderr and '"run.resumed"' in stderr
        assert "researched tides" in _last_tool_text(gw)
        (task_id,) = (await trio.to_thread.run_sync(launch.tasks_state, task_peer.url))["tasks"]
        assert task_id in stderr
        kinds = _kinds(state)
        assert kinds.count("tool.task") == 1 and kinds.count("tool.outcome") == 1 and kinds[-1] == "run.ended"
