"""What one run of the loop ends as: a status, the distilled result, usage, and the exit code it maps to.

The status enum is the single place that decides exit codes for a run (the original agentd's once
mapping, docs/cli.md): completed 0 (partial 3), refused 5, budget exhaustion 7, intelligence failure 4,
a required MCP server down 6, everything else 1.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from agentd.errors import ExitCode


class RunStatus(enum.StrEnum):
    """Terminal status of a run; the string values are what stdout and events carry."""

    COMPLETED = "completed"
    EXHAUSTED_STEPS = "exhausted_steps"
    EXHAUSTED_TOKENS = "exhausted_tokens"
    #: The tree's money budget (``--budget-usd``) is spent.
    EXHAUSTED_BUDGET = "exhausted_budget"
    DEADLINE = "deadline"
    INTELLIGENCE_FAILED = "intelligence_failed"
    MCP_FAILED = "mcp_failed"
    REFUSED = "refused"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CRASHED = "crashed"

    @property
    def is_budget(self) -> bool:
        return self in _BUDGET


_BUDGET = frozenset({RunStatus.EXHAUSTED_STEPS, RunStatus.EXHAUSTED_TOKENS, RunStatus.EXHAUSTED_BUDGET,
                     RunStatus.DEADLINE})

_EXIT = {
    RunStatus.COMPLETED: ExitCode.OK,
    RunStatus.EXHAUSTED_STEPS: ExitCode.BUDGET,
    RunStatus.EXHAUSTED_TOKENS: ExitCode.BUDGET,
    RunStatus.EXHAUSTED_BUDGET: ExitCode.BUDGET,
    RunStatus.DEADLINE: ExitCode.BUDGET,
    RunStatus.INTELLIGENCE_FAILED: ExitCode.INTELLIGENCE,
    RunStatus.MCP_FAILED: ExitCode.MCP_REQUIRED,
    RunStatus.REFUSED: ExitCode.REFUSED,
    RunStatus.FAILED: ExitCode.FAILURE,
    RunStatus.CANCELLED: ExitCode.FAILURE,
    RunStatus.CRASHED: ExitCode.FAILURE,
}


@attrs.frozen
class RunUsage:
    """Tokens the intelligence reported for one run (summed over every model call), or for a subtree of runs.

    ``estimated_tokens`` says how many of them are an estimate: a reply cut (a deadline, a cancellation) before
    the gateway reported its usage is counted from what it had streamed (agentd.intelligence.tally).

    ``cost`` is what those tokens cost in picodollars (agentd.prices: exact integers), each reply priced by the
    model that made it; None when the run is not priced (no ``--price`` for its models): then no ``cost_usd``.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated_tokens: int = 0
    cost: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, prompt_tokens: int, completion_tokens: int, estimated_tokens: int = 0,
            cost: int | None = None) -> RunUsage:
        return RunUsage(self.prompt_tokens + prompt_tokens, self.completion_tokens + completion_tokens,
                        self.estimated_tokens + estimated_tokens,
                        self.cost if cost is None else (self.cost or 0) + cost)

    def __add__(self, other: RunUsage) -> RunUsage:
        if not isinstance(other, RunUsage):
            return NotImplemented
        return self.add(other.prompt_tokens, other.completion_tokens, other.estimated_tokens, other.cost)

    def to_json(self) -> dict[str, Any]:
        """``{prompt_tokens, completion_tokens, total_tokens}``, ``estimated_tokens`` when some are, and
        ``cost_usd`` (a JSON number of US dollars) when the run is priced."""
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }
        if self.estimated_tokens:
            out["estimated_tokens"] = self.estimated_tokens
        if self.cost is not None:  # agentd.prices.usd, inline: every step's loop.step line writes this
            out["cost_usd"] = self.cost / 1_000_000_000_000  # picodollars as dollars, correctly rounded
        return out

    @classmethod
    def from_json(cls, raw: Any) -> RunUsage:
        """What :meth:`to_json` wrote (odd or missing fields count 0)."""
        if not isinstance(raw, Mapping):
            return cls()

        def count(key: str) -> int:
            value = raw.get(key, 0)
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

        cost = raw.get("cost_usd")
        priced = None
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
            from agentd.prices import parse_usd

            priced = parse_usd(round(cost, 12), "cost_usd")
        return cls(count("prompt_tokens"), count("completion_tokens"), count("estimated_tokens"), priced)


@attrs.frozen
class RunResult:
    """The outcome of one run: exactly what the CLI prints on stdout, plus the reason for failures.

    ``result`` is the distillate: a parsed JSON value when an output contract was given and the model
    answered in JSON, else text; ``None`` when the run produced nothing. ``error`` is a one-line,
    secret-free reason for a non-completed status (stderr only, never on stdout).
    """

    run_id: str
    status: RunStatus
    partial: bool = False
    result: Any = None
    steps: int = 0
    #: The run's own model calls.
    usage: RunUsage = RunUsage()
    done: bool = True
    error: str | None = None
    #: Ended at a step boundary because the daemon was asked to drain: a clean drain exits 0.
    drained: bool = False
    #: Every subagent's below this run (their whole subtrees), each counted once.
    subagents: RunUsage = RunUsage()

    @property
    def tree_usage(self) -> RunUsage:
        """The whole tree's: the run's own and its subagents'."""
        return self.usage + self.subagents

    def usage_json(self) -> dict[str, Any]:
        """The ``usage`` object: the whole tree's counts, and the run's own share under ``own``."""
        return {**self.tree_usage.to_json(), "own": self.usage.to_json()}

    @property
    def exit_code(self) -> ExitCode:
        if self.drained and self.status is RunStatus.CANCELLED:
            return ExitCode.OK
        code = _EXIT[self.status]
        if code is ExitCode.OK and self.partial:
            return ExitCode.PARTIAL
        return code

    def to_json(self) -> dict[str, Any]:
        """The stdout contract: ``{run_id, status, done, partial, result, steps, usage}`` (:meth:`usage_json`)."""
        return {
            "run_id": self.run_id,
            "status": self.status.value,
            "done": self.done,
            "partial": self.partial,
            "result": self.result,
            "steps": self.steps,
            "usage": self.usage_json(),
        }
