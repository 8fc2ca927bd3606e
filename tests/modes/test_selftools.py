"""The self-tools' queues, caps and argument checks, called the way the loop calls them."""

from collections.abc import Mapping
from typing import Any

import trio

from agentd.agent.control import ControlContext, ControlResult, ControlToolRegistry
from agentd.modes.condition import Condition
from agentd.modes.selftools import AwaitOutcome, SelfRequests, register_self_tools
from agentd.telemetry.events import null_log

CTX = ControlContext(run_id="r1", log=null_log(), step=1)


class FixedAwaiter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Condition | None, float]] = []

    async def await_resource(self, uri: str, condition: Condition | None, timeout: float) -> AwaitOutcome:
        self.calls.append((uri, condition, timeout))
        if uri == "slow://":
            await trio.sleep(timeout)  # virtual time: only the autojump_clock test awaits slow://
            return AwaitOutcome(uri, None, timeout, 0)
        return AwaitOutcome(uri, [{"uri": uri, "text": '{"state": "ready"}'}], 0.5, 2)


async def call(registry: ControlToolRegistry, name: str, args: Mapping[str, Any]) -> ControlResult:
    tool = registry.get(name)
    assert tool is not None
    return await tool.handler(args, CTX)


def make() -> tuple[ControlToolRegistry, SelfRequests, FixedAwaiter]:
    registry, requests, awaiter = ControlToolRegistry(), SelfRequests(), FixedAwaiter()
    register_self_tools(registry, requests, awaiter)
    return registry, requests, awaiter


async def test_names_and_schemas() -> None:
    registry, _, _ = make()
    assert [t.name for t in registry] == ["subscribe", "unsubscribe", "schedule", "await_resource"]
    plain = ControlToolRegistry()
    register_self_tools(plain, SelfRequests())
    assert "await_resource" not in plain


async def test_subscribe_queues_until_the_cap() -> None:
    registry, requests, _ = make()
    for i in range(10):
        assert not (await call(registry, "subscribe", {"uri": f"file:///{i}"})).is_error
    for i in range(6):
        assert not (await call(registry, "unsubscribe", {"uri": f"file:///{i}"})).is_error
    over = await call(registry, "subscribe", {"uri": "file:///17"})
    assert over.is_error and "16" in over.content[0]["text"]
    assert len(requests.subscriptions) == 16
    assert requests.subscriptions[0].action == "subscribe" and requests.subscriptions[-1].action == "unsubscribe"


async def test_empty_uri_is_an_error_but_any_uri_is_accepted() -> None:
    registry, requests, _ = make()
    assert (await call(registry, "subscribe", {"uri": "  "})).is_error
    assert (await call(registry, "unsubscribe", {})).is_error
    assert not (await call(registry, "subscribe", {"uri": "weird://template/{x}"})).is_error
    assert [r.uri for r in requests.subscriptions] == ["weird://template/{x}"]


async def test_schedule_range_and_cap() -> None:
    registry, requests, _ = make()
    for bad in ({"after_seconds": 0.5, "instruction": "x"}, {"after_seconds": 2592001, "instruction": "x"},
                {"after_seconds": True, "instruction": "x"}, {"after_seconds": 5, "instruction": ""}):
        assert (await call(registry, "schedule", bad)).is_error
    for i in range(8):
        assert not (await call(registry, "schedule", {"after_seconds": 1 + i, "instruction": f"job {i}"})).is_error
    assert (await call(registry, "schedule", {"after_seconds": 5, "instruction": "ninth"})).is_error
    assert [s.after_seconds for s in requests.schedules] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert not requests.subscriptions


async def test_await_resource_returns_contents_and_validates() -> None:
    registry, _, awaiter = make()
    ok = await call(registry, "await_resource",
                    {"uri": "file:///s", "condition": {"pointer": "/state", "op": "eq", "value": "ready"},
                     "timeout_s": 5})
    assert not ok.is_error and ok.structured is not None and ok.structured["timed_out"] is False
    assert ok.content[1]["resource"]["text"] == '{"state": "ready"}'
    assert awaiter.calls[0][1] == Condition("/state", "eq", "ready") and awaiter.calls[0][2] == 5.0
    for bad in ({"uri": ""}, {"uri": "u", "timeout_s": 0}, {"uri": "u", "timeout_s": 99999},
                {"uri": "u", "condition": {"pointer": "nope", "op": "eq", "value": 1}}):
        assert (await call(registry, "await_resource", bad)).is_error
    assert len(awaiter.calls) == 1


async def test_await_resource_timeout_is_an_observation(autojump_clock: trio.abc.Clock) -> None:
    registry, _, _ = make()
    result = await call(registry, "await_resource", {"uri": "slow://", "timeout_s": 30})
    assert not result.is_error and result.structured is not None and result.structured["timed_out"] is True
    assert "within 30 s" in result.content[0]["text"]
