"""The loop's side of money: a priced run counts each reply's cost in its usage and tells its usage hook; the
tree's answer ``budget_usd`` ends it ``exhausted_budget`` (exit 7) at that reply, and a priced run whose tree
has nothing left makes no model request at all."""

from __future__ import annotations

from typing import Any

from agentd.agent.result import RunStatus
from agentd.agent.runner import RunRequest
from agentd.errors import ExitCode
from agentd.intelligence.wire import Usage
from agentd.prices import BUDGET_USD, Price
from agentd.run import run_with
from agentd.telemetry.events import EventLog
from tests.agent.scripted import MemoryPool, ScriptedModel, call, final, text_result, tools_reply

PRICE = Price(3_000_000, 15_000_000)  # $3 / $15 per million tokens


def _pool() -> MemoryPool:
    pool = MemoryPool()

    async def echo(args: Any) -> Any:
        return text_result("ok")

    pool.add("s", "echo", echo, {"type": "object"})
    return pool


async def _run(model: ScriptedModel, on_usage: Any, price: Price | None = PRICE) -> Any:
    log = EventLog(sink=lambda line: None, run_id="run-1")
    return await run_with(RunRequest("do it", "run-1", price=price), pool=_pool(), intel=model, log=log,
                          on_usage=on_usage)


async def test_each_reply_is_priced_and_the_hook_is_told_its_cost() -> None:
    seen: list[tuple[Usage, int | None]] = []
    model = ScriptedModel([tools_reply(call("s__echo", {}), tokens=7), final("done", tokens=9)])
    result = await _run(model, lambda usage, cost: seen.append((usage, cost)))
    # a zero report first (the tree's books asked before the first call), then each reply with its cost beside it
    assert seen == [(Usage(), 0), (Usage(7, 1), 7 * 3_000_000 + 15_000_000), (Usage(9, 1), 9 * 3_000_000 + 15_000_000)]
    assert result.usage.cost == 16 * 3_000_000 + 2 * 15_000_000
    assert result.usage_json()["cost_usd"] == 0.000078 and result.usage_json()["own"]["cost_usd"] == 0.000078
    unpriced = await _run(ScriptedModel([final("done", tokens=9)]), None, price=None)
    assert "cost_usd" not in unpriced.usage_json()


async def test_the_reply_that_spends_the_money_ends_the_run() -> None:
    model = ScriptedModel([tools_reply(call("s__echo", {}), tokens=7), final("never asked", tokens=9)])
    result = await _run(model, lambda usage, cost: BUDGET_USD if usage.total else False)
    assert result.status is RunStatus.EXHAUSTED_BUDGET and result.exit_code is ExitCode.BUDGET and result.partial
    assert result.steps == 1 and len(model.requests) == 1


async def test_a_tree_with_no_money_left_gets_no_model_request() -> None:
    model = ScriptedModel([final("never asked", tokens=9)])
    result = await _run(model, lambda usage, cost: BUDGET_USD)
    assert result.status is RunStatus.EXHAUSTED_BUDGET and result.steps == 0 and model.requests == []
