"""Per-run budgets: steps, tokens and a wall-clock deadline (the original agentd's defaults).

Steps and tokens are counted here; the deadline is a ``trio.move_on_after`` owned by the runner so the
best result so far survives the cut. A budget is checked *before* each model call, so a run never
starts a step it is not allowed to finish accounting for. The tree's token ceiling is the supervisor's
(agentd.supervisor.caps): it answers each reply's usage report, and the runner ends the run at the reply
that spends it (``exhausted_tokens``, like ``--max-tokens``). A reply cut mid-call is counted too, from what
the gateway had streamed (agentd.intelligence.tally), its estimated tokens marked.
"""

from __future__ import annotations

import math

import attrs

from agentd import defaults
from agentd.agent.result import RunStatus, RunUsage
from agentd.prices import Price

DEFAULT_MAX_STEPS = defaults.MAX_STEPS
DEFAULT_MAX_TOKENS = defaults.MAX_TOKENS
DEFAULT_DEADLINE = defaults.DEADLINE


@attrs.frozen
class Limits:
    """The three per-run budgets. ``deadline`` is seconds; ``math.inf`` (or 0 tokens/steps) never binds."""

    max_steps: int = DEFAULT_MAX_STEPS
    max_tokens: int = DEFAULT_MAX_TOKENS
    deadline: float = DEFAULT_DEADLINE

    def __attrs_post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.max_tokens < 0 or self.deadline <= 0 or math.isnan(self.deadline):
            raise ValueError("max_tokens must be >= 0 and deadline > 0")


class BudgetMeter:
    """Counts one run's steps and tokens against its :class:`Limits`. (A plain class: a once run builds it at start-up, where an attrs class costs about a millisecond of CPU.)"""

    __slots__ = ("limits", "price", "steps", "usage")

    def __init__(self, limits: Limits, steps: int = 0, usage: RunUsage | None = None,
                 price: Price | None = None) -> None:
        self.limits = limits
        self.steps = steps
        #: The run's model's price (agentd.prices), when the run is priced: every reply's cost is counted.
        self.price = price
        self.usage = (RunUsage() if price is None else RunUsage(cost=0)) if usage is None else usage

    def exhausted(self) -> RunStatus | None:
        """The budget that forbids another model call, or ``None`` when the run may continue."""
        if self.steps >= self.limits.max_steps:
            return RunStatus.EXHAUSTED_STEPS
        if self.limits.max_tokens and self.usage.total_tokens >= self.limits.max_tokens:
            return RunStatus.EXHAUSTED_TOKENS
        return None

    def add_usage(self, prompt_tokens: int, completion_tokens: int, estimated_tokens: int = 0) -> int | None:
        """Count one reply; returns what it cost in picodollars (None: the run is not priced)."""
        cost = None if self.price is None else self.price.cost(prompt_tokens, completion_tokens)
        self.usage = self.usage.add(prompt_tokens, completion_tokens, estimated_tokens, cost)
        return cost
