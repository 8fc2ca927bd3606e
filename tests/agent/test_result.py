"""Run statuses map to the original agentd's exit codes; the stdout object has exactly the contract keys."""

from __future__ import annotations

import pytest

from agentd.agent.result import RunResult, RunStatus, RunUsage
from agentd.errors import ExitCode


@pytest.mark.parametrize(
    ("status", "partial", "code"),
    [
        (RunStatus.COMPLETED, False, ExitCode.OK),
        (RunStatus.COMPLETED, True, ExitCode.PARTIAL),
        (RunStatus.EXHAUSTED_STEPS, True, ExitCode.BUDGET),
        (RunStatus.EXHAUSTED_TOKENS, True, ExitCode.BUDGET),
        (RunStatus.DEADLINE, True, ExitCode.BUDGET),
        (RunStatus.INTELLIGENCE_FAILED, False, ExitCode.INTELLIGENCE),
        (RunStatus.MCP_FAILED, False, ExitCode.MCP_REQUIRED),
        (RunStatus.REFUSED, False, ExitCode.REFUSED),
        (RunStatus.FAILED, False, ExitCode.FAILURE),
        (RunStatus.CANCELLED, False, ExitCode.FAILURE),
        (RunStatus.CRASHED, True, ExitCode.FAILURE),
    ],
)
def test_exit_codes(status: RunStatus, partial: bool, code: ExitCode) -> None:
    assert RunResult("r", status, partial=partial).exit_code is code


def test_stdout_contract() -> None:
    result = RunResult("r1", RunStatus.COMPLETED, result={"a": 1}, steps=3, usage=RunUsage(10, 5), error="x")
    assert result.to_json() == {
        "run_id": "r1",
        "status": "completed",
        "done": True,
        "partial": False,
        "result": {"a": 1},
        "steps": 3,
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                  "own": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}},
    }


def test_the_usage_is_the_whole_trees_with_the_runs_own_share_and_the_estimates_marked() -> None:
    result = RunResult("r1", RunStatus.COMPLETED, usage=RunUsage(10, 5, estimated_tokens=3),
                       subagents=RunUsage(100, 20))
    assert result.to_json()["usage"] == {
        "prompt_tokens": 110, "completion_tokens": 25, "total_tokens": 135, "estimated_tokens": 3,
        "own": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "estimated_tokens": 3},
    }
    assert RunUsage.from_json(result.to_json()["usage"]["own"]) == RunUsage(10, 5, 3)
