"""Shared bits: one step's records and a controllable wall clock."""

from __future__ import annotations

import attrs

from agentd.journal.records import ModelReply, ToolCallOutcome, ToolCallRequested, Usage


@attrs.define
class WallClock:
    """A wall clock the test moves by hand (timestamps, retention ages, lease expiry)."""

    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def step(n: int) -> list:
    call = f"call-{n}"
    return [
        ModelReply(n, {"role": "assistant", "content": None,
                       "tool_calls": [{"id": call, "name": "docs__search", "arguments": '{"q": "x"}'}]}),
        ToolCallRequested(n, call, "docs__search", {"q": "x"}),
        ToolCallOutcome(n, call, True, "result " * 20),
        Usage(n, 1000 + n, 50),
    ]
