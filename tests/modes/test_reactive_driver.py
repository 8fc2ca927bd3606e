"""The reactive driver end to end in-process: the real router, watcher, self-tools, runs and agent loop,
against an in-memory pool and a scripted model, on the autojump clock."""

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import trio

from agentd.agent.result import RunStatus
from agentd.errors import ConfigError, ExitCode
from agentd.intelligence.wire import ChatTool, ModelReply
from agentd.modes.drivers import DaemonContext, reactive_status, run_daemon
from agentd.modes.entry import loop_run_job
from tests.modes.fakes import MemoryPool, ScriptedModel, call, final, first_user
from tests.modes.harness import context, running


def reactive(pool: MemoryPool, model: ScriptedModel, **config: Any) -> DaemonContext:
    config.setdefault("mode", "reactive")
    config.setdefault("instruction", "triage the inbox")
    # The run job needs the log the context builds, so bind it after.
    ctx = context(lambda *a: None, pool=pool, **config)  # type: ignore[arg-type, return-value]
    ctx.runs.run_job = loop_run_job(pool, model, ctx.log)
    return ctx


def wake_prompts(model: ScriptedModel) -> list[str]:
    return [text for _, text in model.requests if "This run was started because" in text]


async def test_one_update_one_wake_reading_the_new_content(autojump_clock: trio.abc.Clock) -> None:
    pool, model = MemoryPool(state={"file:///inbox": "v0"}), ScriptedModel()
    async with running(reactive(pool, model, subscribe=("file:///inbox",))) as daemon:
        assert pool.subscribed == {"file:///inbox"}
        await trio.sleep(5)
        assert model.requests == []  # no run until something changes
        bumped = trio.current_time()
        pool.bump("file:///inbox", "v1: invoice from ACME")
        await trio.sleep(5)
        result = await daemon.drain()
    [(when, prompt)] = model.requests
    assert when - bumped < 0.005
    assert prompt.startswith("triage the inbox")
    assert "file:///inbox" in prompt and "v1: invoice from ACME" in prompt
    assert result.exit_code is ExitCode.OK and result.result["runs"] == 1
    assert pool.subscribed == set() and ("unsubscribe", "file:///inbox") in pool.calls
    [wake] = daemon.named("reactive.wake")
    assert wake["uri"] == "file:///inbox"
    ends = [e for e in daemon.named("run.end") if e.get("trigger") == "wake"]
    assert ends[0]["run_id"] == "r.1" and ends[0]["uri"] == "file:///inbox"


async def test_burst_gives_few_wakes_and_the_last_reads_the_final_state(autojump_clock: trio.abc.Clock) -> None:
    pool, model = MemoryPool(state={"u://a": "0"}), ScriptedModel(delay=0.05)
    async with running(reactive(pool, model, subscribe=("u://a",))) as daemon:
        for i in range(1, 51):
            pool.bump("u://a", f"state {i}")
            await trio.sleep(0.002)
        await trio.sleep(5)
        await daemon.drain()
    prompts = wake_prompts(model)
    assert 1 <= len(prompts) <= 3
    assert "state 50" in prompts[-1]


async def test_two_uris_wake_independently(autojump_clock: trio.abc.Clock) -> None:
    pool, model = MemoryPool(state={"u://a": "a0", "u://b": "b0"}), ScriptedModel(delay=10.0)
    async with running(reactive(pool, model, subscribe=("u://a", "mem:u://b"))) as daemon:
        pool.bump("u://a", "a1")
        await trio.sleep(1)
        pool.bump("u://b", "b1")  # a's wake is still thinking: b does not wait for it
        await trio.sleep(1)
        assert len(model.requests) == 2
        await trio.sleep(20)
        await daemon.drain()
    assert ["a1" in p for p in wake_prompts(model)] == [True, False]
    assert ["b1" in p for p in wake_prompts(model)] == [False, True]


async def test_self_subscribe_applies_after_the_run_then_wakes_the_agent(autojump_clock: trio.abc.Clock) -> None:
    pool = MemoryPool(state={"u://a": "a0", "u://b": "b0"})
    seen_during_run: list[set[str]] = []

    def script(messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        if "a1" in first_user(messages) and messages[-1]["role"] == "user":
            return call("subscribe", {"uri": "u://b"})
        seen_during_run.append(set(pool.subscribed))
        return final()

    model = ScriptedModel(script)
    ctx = reactive(pool, model, subscribe=("u://a",))
    async with running(ctx) as daemon:
        pool.bump("u://a", "a1")
        await trio.sleep(1)
        assert seen_during_run == [{"u://a"}]  # queued, not applied while the run was going
        assert pool.subscribed == {"u://a", "u://b"}
        assert {v.uri: v.origins for v in ctx.watcher.view()} == {"u://a": ("config",), "u://b": ("self",)}
        status = reactive_status(ctx)  # what agent://status shows
        assert status is not None and status["subscriptions"] == [
            {"uri": "u://a", "server": None, "origins": ["config"], "delivery": "push"},
            {"uri": "u://b", "server": None, "origins": ["self"], "delivery": "push"},
        ]
        pool.bump("u://b", "b1")
        await trio.sleep(1)
        await daemon.drain()
    assert "b1" in wake_prompts(model)[-1] and "u://b" in wake_prompts(model)[-1]


async def test_self_unsubscribe_stops_wakes_but_never_drops_operator_subscriptions(
    autojump_clock: trio.abc.Clock,
) -> None:
    pool = MemoryPool(state={"u://a": "a0", "u://b": "b0"})

    def script(messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        prompt = first_user(messages)
        if messages[-1]["role"] != "user":
            return final()
        if "a1" in prompt:
            return call("subscribe", {"uri": "u://b"})
        if "b1" in prompt:
            return ModelReply(None, (*call("unsubscribe", {"uri": "u://b"}, call_id="x").tool_calls,
                                     *call("unsubscribe", {"uri": "u://a"}, call_id="y").tool_calls), final().usage)
        return final()

    model = ScriptedModel(script)
    async with running(reactive(pool, model, subscribe=("u://a",))) as daemon:
        pool.bump("u://a", "a1")
        await trio.sleep(1)
        pool.bump("u://b", "b1")
        await trio.sleep(1)
        assert pool.subscribed == {"u://a"}
        pool.bump("u://b", "b2")  # not watched any more: no wake
        await trio.sleep(1)
        pool.bump("u://a", "a2")  # the operator's subscription stayed
        await trio.sleep(1)
        await daemon.drain()
    contents = [p.split("\n")[-2] for p in wake_prompts(model)]
    assert contents == ["a1", "b1", "a2"]
    refused = [e for e in daemon.named("mcp.subscribe") if e.get("applied") is False]
    assert [e["uri"] for e in refused] == ["u://a"]


async def test_await_resource_returns_when_the_condition_holds(autojump_clock: trio.abc.Clock) -> None:
    pool = MemoryPool(state={"u://a": "a0", "job://1": json.dumps({"state": "queued"})})
    results: list[str] = []

    def script(messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        if messages[-1]["role"] == "user":
            return call("await_resource", {"uri": "job://1", "timeout_s": 600,
                                           "condition": {"pointer": "/state", "op": "eq", "value": "done"}})
        results.append(str(messages[-1]["content"]))
        return final()

    model = ScriptedModel(script)
    async with running(reactive(pool, model, subscribe=("u://a",))) as daemon:
        pool.bump("u://a", "a1")
        await trio.sleep(1)
        assert "job://1" in pool.subscribed  # subscribed for the duration of the wait
        pool.bump("job://1", json.dumps({"state": "running"}))
        await trio.sleep(1)
        assert results == []
        pool.bump("job://1", json.dumps({"state": "done", "answer": 42}))
        await trio.sleep(1)
        assert "job://1" not in pool.subscribed  # and unsubscribed after
        await daemon.drain()
    [observation] = results
    assert '"answer": 42' in observation and "after 2 update(s)" in observation
    assert model.requests  # the run went on after the await


async def test_await_resource_times_out_as_an_observation(autojump_clock: trio.abc.Clock) -> None:
    pool = MemoryPool(state={"u://a": "a0", "job://1": "{}"})
    results: list[tuple[float, str]] = []

    def script(messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        if messages[-1]["role"] == "user":
            return call("await_resource", {"uri": "job://1", "timeout_s": 30})
        results.append((trio.current_time(), str(messages[-1]["content"])))
        return final()

    model = ScriptedModel(script)
    async with running(reactive(pool, model, subscribe=("u://a",))) as daemon:
        start = trio.current_time()
        pool.bump("u://a", "a1")
        await trio.sleep(60)
        await daemon.drain()
    [(when, text)] = results
    assert when - start == pytest.approx(30, abs=0.01)
    assert "no matching update of job://1 within 30 s" in text


async def test_poll_degradation(autojump_clock: trio.abc.Clock) -> None:
    pool, model = MemoryPool(push=False, state={"u://a": "a0"}), ScriptedModel()
    async with running(reactive(pool, model, subscribe=("u://a",), poll_interval=2.0)) as daemon:
        await trio.sleep(3)
        assert model.requests == []  # the first poll is the baseline, not a change
        pool.bump("u://a", "a1")
        await trio.sleep(2.5)
        await daemon.drain()
    assert len(model.requests) == 1 and "a1" in model.requests[0][1]
    [degraded] = daemon.named("reactive.degraded")
    assert degraded["level"] == "warn" and degraded["poll_interval"] == 2.0
    assert [e["delivery"] for e in daemon.named("trigger.armed") if "delivery" in e] == ["poll"]


async def test_no_subscribe_capability_and_no_polling_is_a_config_error(autojump_clock: trio.abc.Clock) -> None:
    pool, model = MemoryPool(push=False, state={"u://a": "a0"}), ScriptedModel()
    ctx = reactive(pool, model, subscribe=("u://a",))
    with pytest.raises(ConfigError, match="poll-interval") as info:
        await run_daemon(ctx)
    assert info.value.exit_code is ExitCode.USAGE


async def test_drain_during_a_wake_finishes_it_then_unsubscribes(autojump_clock: trio.abc.Clock) -> None:
    pool, model = MemoryPool(state={"u://a": "a0"}), ScriptedModel(delay=10.0)
    async with running(reactive(pool, model, subscribe=("u://a",), drain_timeout=25.0)) as daemon:
        pool.bump("u://a", "a1")
        await trio.sleep(1)
        started = trio.current_time()
        daemon.ctx.drain.set()
        pool.bump("u://a", "a2")  # arrives during the drain: not taken
        result = await daemon.finished()
        assert trio.current_time() - started == pytest.approx(9, abs=0.01)
    assert result.exit_code is ExitCode.OK and len(model.requests) == 1
    assert pool.subscribed == set()
    ends = [e for e in daemon.named("run.end") if e.get("trigger") == "wake"]
    assert ends[0]["status"] == "completed"


async def test_a_failed_wake_is_logged_and_the_daemon_continues(autojump_clock: trio.abc.Clock) -> None:
    pool, model = MemoryPool(state={"u://a": "a0"}), ScriptedModel()
    async with running(reactive(pool, model, subscribe=("u://a",))) as daemon:
        pool.down = True
        pool.bump("u://a", "a1")  # the read fails: the wake fails
        await trio.sleep(1)
        pool.down = False
        pool.bump("u://a", "a2")
        await trio.sleep(2)
        await daemon.drain()
    assert [e["error"] for e in daemon.named("reactive.wake_failed")] == ["McpTransportError"]
    assert len(model.requests) == 1 and "a2" in model.requests[0][1]


async def test_self_schedule_starts_a_later_run(autojump_clock: trio.abc.Clock) -> None:
    pool = MemoryPool(state={"u://a": "a0"})

    def script(messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        if "changed" in first_user(messages) and messages[-1]["role"] == "user":
            return call("schedule", {"after_seconds": 30, "instruction": "check on the invoice"})
        return final()

    model = ScriptedModel(script)
    async with running(reactive(pool, model, subscribe=("u://a",))) as daemon:
        pool.bump("u://a", "a1")
        await trio.sleep(60)
        await daemon.drain()
    assert [round(t) for t, _ in model.requests] == [0, 0, 30]
    assert model.requests[2][1] == "check on the invoice"
    assert [e["trigger"] for e in daemon.named("trigger.fired")] == ["wake", "scheduled"]


async def test_lifetime_budget_in_reactive_mode_drains_with_exit_0(autojump_clock: trio.abc.Clock) -> None:
    pool, model = MemoryPool(state={"u://a": "a0"}), ScriptedModel(lambda m, t: final(tokens=60))
    async with running(reactive(pool, model, subscribe=("u://a",), budget_tokens_lifetime=100)) as daemon:
        pool.bump("u://a", "a1")
        await trio.sleep(1)
        pool.bump("u://a", "a2")
        result = await daemon.finished()
    assert result.status is RunStatus.COMPLETED and result.exit_code is ExitCode.OK
    assert len(model.requests) == 2 and daemon.named("budget.exhausted")


async def test_continue_feeds_one_session_in_order(autojump_clock: trio.abc.Clock) -> None:
    pool = MemoryPool(state={"u://log": "l0"})
    seeds: list[int] = []

    def script(messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        seeds.append(sum(1 for m in messages if m["role"] == "assistant"))
        return final(f"handled {str(messages[-1]['content']).splitlines()[-2]}")

    model = ScriptedModel(script, delay=0.5)
    async with running(reactive(pool, model, continue_uris=("u://log",))) as daemon:
        for i in range(1, 4):
            pool.bump("u://log", f"entry {i}")
            await trio.sleep(2)
        await daemon.drain()
    texts = [t for _, t in model.requests]
    assert [t.splitlines()[-2] for t in texts] == ["entry 1", "entry 2", "entry 3"]
    assert texts[0].startswith("triage the inbox")  # the first turn carries the instruction
    assert seeds == [0, 1, 2]  # each turn continues the conversation
    assert [e.get("route") for e in daemon.named("reactive.wake")] == ["continue"] * 3


async def test_polling_sees_appear_and_disappear_and_logs_a_failure_streak_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    pool, model = MemoryPool(push=False, state={}), ScriptedModel()
    async with running(reactive(pool, model, subscribe=("u://late",), poll_interval=1.0)) as daemon:
        await trio.sleep(2.5)
        pool.state["u://late"] = "born"  # appears: a change
        await trio.sleep(2)
        pool.down = True
        await trio.sleep(5)  # five failed polls
        pool.down = False
        del pool.state["u://late"]  # gone: a change too
        await trio.sleep(2)
        await daemon.drain()
    prompts = wake_prompts(model)
    assert len(prompts) == 2
    assert "born" in prompts[0] and "no longer exists" in prompts[1]
    failures = [e for e in daemon.named("reactive.degraded") if "error" in e]
    assert [e["error"] for e in failures] == ["McpTransportError"]


async def test_failing_wakes_back_off_and_the_breaker_ends_a_reactive_daemon_with_exit_1(
    autojump_clock: trio.abc.Clock,
) -> None:
    from agentd.errors import IntelligenceError

    def script(messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        raise IntelligenceError("every gateway is down")

    uris = [f"u://{i}" for i in range(8)]
    pool, model = MemoryPool(state=dict.fromkeys(uris, "0")), ScriptedModel(script)
    async with running(reactive(pool, model, subscribe=tuple(uris), max_concurrent_wakes=1)) as daemon:

        async def keep_changing() -> None:  # a saturated daemon batches waiting URIs: keep them changing
            for value in range(1, 1000):
                for uri in uris:
                    pool.bump(uri, str(value))
                await trio.sleep(0.1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_changing)
            result = await daemon.finished()
            nursery.cancel_scope.cancel()
    assert result.exit_code is ExitCode.FAILURE and "breaker" in (result.error or "")
    starts = [round(t, 2) for t, _ in model.requests]
    assert starts == [0, 0.5, 1.5, 3.5, 7.5, 15.5]  # one wake at a time, each after the backoff
    assert [e["status"] for e in daemon.named("reactive.wake_failed")] == ["intelligence_failed"] * 6


async def test_a_busy_continue_session_does_not_hold_fresh_wakes_back(autojump_clock: trio.abc.Clock) -> None:
    pool = MemoryPool(state={"u://log": "l0", "u://a": "a0"})
    model = ScriptedModel(delay=10.0)
    cfg = {"continue_uris": ("u://log",), "subscribe": ("u://a",), "max_concurrent_wakes": 1}
    async with running(reactive(pool, model, **cfg)) as daemon:
        pool.bump("u://log", "entry 1")  # a 10 s turn of the warm session
        await trio.sleep(1)
        pool.bump("u://a", "a1")  # a fresh wake: not queued behind the session
        await trio.sleep(1)
        assert len(model.requests) == 2
        await daemon.drain()


async def test_a_saturated_daemon_reads_waiting_uris_in_one_wake(autojump_clock: trio.abc.Clock) -> None:
    """Every slot busy: the URIs that queued meanwhile are read together and run once, each with its
    current content (a vanished one says so); each URI's later change still earns it a wake."""
    uris = [f"u://{i}" for i in range(5)]
    pool, model = MemoryPool(state={u: f"{u} v0" for u in uris}), ScriptedModel(delay=2.0)
    async with running(reactive(pool, model, subscribe=tuple(uris), max_concurrent_wakes=1)) as daemon:
        pool.bump("u://0", "u://0 v1")
        await trio.sleep(0.5)  # u://0's wake is thinking; the rest queue behind the one slot
        for uri in uris[1:]:
            pool.bump(uri, f"{uri} v1")
        del pool.state["u://4"]
        await trio.sleep(3)  # the second wake started with all four waiting URIs
        pool.bump("u://2", "u://2 v2")
        await trio.sleep(10)
        await daemon.drain()
    first, batch, last = wake_prompts(model)
    assert "u://0 v1" in first and "u://1" not in first
    assert "4 MCP resources changed" in batch
    assert all(f"{uri} v1" in batch for uri in uris[1:4])
    assert "u://4 on server \"mem\": no longer exists" in batch
    assert "u://2 v2" in last and "u://1" not in last
    wakes = [(w["uri"], w.get("batch")) for w in daemon.named("reactive.wake")]
    assert wakes[0] == ("u://0", None) and wakes[-1] == ("u://2", None)
    assert sorted(wakes[1:-1]) == [(uri, 4) for uri in uris[1:]]
