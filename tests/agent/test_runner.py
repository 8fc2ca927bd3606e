"""The step loop with in-process dependencies: observations, rejections, faults, budgets, contracts."""

from __future__ import annotations

from typing import Any

import trio

from agentd.agent.budgets import Limits
from agentd.agent.control import ControlContext, ControlResult, ControlTool, ControlToolRegistry
from agentd.agent.result import RunStatus
from agentd.agent.runner import MAX_CONSECUTIVE_FAULTS, RunRequest
from agentd.client.models import ResourceInfo
from agentd.errors import IntelligenceError, McpRpcError, McpTransportError
from agentd.intelligence.wire import Usage
from agentd.run import run_with
from agentd.telemetry.events import EventLog
from tests.agent.scripted import MemoryPool, ScriptedModel, call, final, text_result, tools_reply

ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"], "additionalProperties": False}


async def _add(args: Any) -> Any:
    return text_result(str(args["a"] + args["b"]))


def _pool() -> MemoryPool:
    pool = MemoryPool()
    pool.add("s", "add", _add, ADD_SCHEMA)
    return pool


async def _run(model: ScriptedModel, pool: MemoryPool, *, limits: Limits = Limits(), contract: str | None = None,
               controls: ControlToolRegistry | None = None, lines: list[dict[str, Any]] | None = None,
               on_usage: Any = None) -> Any:
    log = EventLog(sink=(lines.append if lines is not None else lambda line: None), run_id="run-1")
    request = RunRequest("add things", "run-1", limits, contract)
    return await run_with(request, pool=pool, intel=model, log=log, controls=controls, on_usage=on_usage)


def _tool_messages(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


async def test_tool_call_observation_final() -> None:
    pool = _pool()
    model = ScriptedModel([tools_reply(call("s__add", {"a": 2, "b": 3})), final("it is 5")])
    lines: list[dict[str, Any]] = []
    result = await _run(model, pool, lines=lines)
    assert (result.status, result.result, result.steps, result.partial) == (RunStatus.COMPLETED, "it is 5", 2, False)
    assert pool.calls == [("s", "add", {"a": 2, "b": 3}, "run-1")]
    second = model.requests[1][0]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "s__add"
    assert second[-1] == {"role": "tool", "tool_call_id": "c-s__add", "content": "5"}
    assert result.usage.total_tokens == 22
    events = [line["event"] for line in lines]
    for name in ("loop.start", "loop.step", "tool.call", "tool.result", "loop.final"):
        assert name in events
    assert all(line["run_id"] == "run-1" for line in lines)
    tool_result = next(line for line in lines if line["event"] == "tool.result")
    assert tool_result["size"] == 1 and tool_result["content"] == 1  # lengths only


async def test_calls_in_one_reply_run_in_model_order() -> None:
    pool = _pool()
    calls = [call("s__add", {"a": i, "b": 0}, f"c{i}") for i in range(4)]
    model = ScriptedModel([tools_reply(*calls), final("done")])
    await _run(model, pool)
    assert [c[2]["a"] for c in pool.calls] == [0, 1, 2, 3]
    assert _tool_messages(model.requests[1][0]) == ["0", "1", "2", "3"]


async def test_unknown_tool_and_bad_arguments_are_rejected_observations() -> None:
    pool = _pool()
    model = ScriptedModel([
        tools_reply(call("s__nope", {}, "c1"), call("s__add", "{not json", "c2"), call("s__add", {"a": "x", "b": 1}, "c3"),
                    call("s__add", [1, 2], "c4")),
        tools_reply(call("s__add", {"a": 1, "b": 1}, "c5")),
        final("2"),
    ])
    result = await _run(model, pool)
    assert result.status is RunStatus.COMPLETED and result.steps == 3
    assert pool.calls == [("s", "add", {"a": 1, "b": 1}, "run-1")]  # nothing invalid was sent
    rejected = _tool_messages(model.requests[1][0])
    assert len(rejected) == 4 and all(r.startswith("[agentd rejected this call") for r in rejected)
    assert "unknown tool 's__nope'" in rejected[0] and "s__add" in rejected[0]
    assert "not valid JSON" in rejected[1]
    assert "inputSchema" in rejected[2] and "integer" in rejected[2]
    assert "JSON object" in rejected[3]


async def test_is_error_is_an_observation_the_model_corrects() -> None:
    pool = _pool()

    async def picky(args: Any) -> Any:
        if args.get("path") != "/ok":
            return text_result(f"file not found: {args.get('path')}", is_error=True)
        return text_result("contents")

    pool.add("s", "read", picky, {"type": "object", "properties": {"path": {"type": "string"}}})
    model = ScriptedModel([tools_reply(call("s__read", {"path": "/bad"})), tools_reply(call("s__read", {"path": "/ok"})),
                           final("contents")])
    result = await _run(model, pool)
    assert result.status is RunStatus.COMPLETED and result.steps == 3
    first_obs = _tool_messages(model.requests[1][0])[-1]
    assert first_obs.startswith("[tool error") and "file not found: /bad" in first_obs


async def test_rpc_errors_are_labelled_faults_and_a_streak_ends_the_run() -> None:
    pool = _pool()
    attempts = 0

    async def broken(args: Any) -> Any:
        nonlocal attempts
        attempts += 1
        if attempts % 2:
            raise McpRpcError(-32603, "internal", server="s", method="tools/call")
        raise McpTransportError("connection reset", server="s")

    pool.add("s", "broken", broken)
    model = ScriptedModel([tools_reply(call("s__broken", {}))])
    lines: list[dict[str, Any]] = []
    result = await _run(model, pool, limits=Limits(max_steps=10), lines=lines)
    # Both failures count toward "down": the (required) server is marked down, which is exit 6.
    assert result.status is RunStatus.MCP_FAILED and result.exit_code == 6
    assert attempts == MAX_CONSECUTIVE_FAULTS and result.steps == MAX_CONSECUTIVE_FAULTS
    (down,) = [line for line in lines if line["event"] == "mcp.server_down"]
    assert (down["server"], down["required"], down["failures"]) == ("s", True, 3)
    observation = _tool_messages(model.requests[1][0])[-1]
    assert observation.startswith("[agentd tool fault") and "not the tool's output" in observation
    assert "JSON-RPC error -32603" in observation


async def test_a_success_resets_the_fault_streak() -> None:
    pool = _pool()

    async def broken(args: Any) -> Any:
        raise McpRpcError(-32603, "internal", server="s")

    pool.add("s", "broken", broken)
    script = [tools_reply(call("s__broken", {})), tools_reply(call("s__broken", {})),
              tools_reply(call("s__add", {"a": 1, "b": 2})), tools_reply(call("s__broken", {})),
              tools_reply(call("s__broken", {})), final("ok")]
    result = await _run(ScriptedModel(script), pool)
    assert result.status is RunStatus.COMPLETED and result.steps == 6


async def test_step_budget_keeps_best_result() -> None:
    pool = _pool()
    model = ScriptedModel([tools_reply(call("s__add", {"a": 1, "b": 1}), content="partial thought")])
    lines: list[dict[str, Any]] = []
    result = await _run(model, pool, limits=Limits(max_steps=4), lines=lines)
    assert (result.status, result.steps, result.partial, result.result) == (
        RunStatus.EXHAUSTED_STEPS, 4, True, "partial thought")
    assert result.exit_code == 7 and len(pool.calls) == 4
    budget = next(line for line in lines if line["event"] == "loop.budget")
    assert budget["budget"] == "exhausted_steps"


async def test_token_budget() -> None:
    pool = _pool()
    model = ScriptedModel([tools_reply(call("s__add", {"a": 1, "b": 1}), tokens=400)])
    result = await _run(model, pool, limits=Limits(max_tokens=1000))
    assert result.status is RunStatus.EXHAUSTED_TOKENS and result.exit_code == 7
    assert result.steps == 3 and result.usage.total_tokens == 1203 and result.partial


async def test_deadline_cuts_a_slow_tool_and_keeps_best(autojump_clock: Any) -> None:
    pool = _pool()

    async def slow(args: Any) -> Any:
        await trio.sleep(10_000)
        return text_result("late")

    pool.add("s", "slow", slow)
    model = ScriptedModel([tools_reply(call("s__add", {"a": 1, "b": 1}), content="first"),
                           tools_reply(call("s__slow", {}), content="waiting")])
    start = trio.current_time()
    result = await _run(model, pool, limits=Limits(deadline=600))
    assert trio.current_time() - start == 600
    assert (result.status, result.partial, result.result, result.exit_code) == (RunStatus.DEADLINE, True, "waiting", 7)


async def test_output_contract_parses_json_and_reprompts_once() -> None:
    pool = _pool()
    model = ScriptedModel([final("The sum is five."), final('```json\n{"sum": 5}\n```')])
    result = await _run(model, pool, contract='{"sum": integer}')
    assert result.result == {"sum": 5} and result.steps == 2 and not result.partial
    system = model.requests[0][0][0]["content"]
    assert "Output contract" in system and '{"sum": integer}' in system
    assert "did not contain a JSON value" in model.requests[1][0][-1]["content"]


async def test_output_contract_gives_up_after_one_reprompt() -> None:
    result = await _run(ScriptedModel([final("no json"), final("still none")]), _pool(), contract="an object")
    assert result.status is RunStatus.COMPLETED and result.result == "still none" and result.steps == 2


async def test_cut_by_max_output_tokens_is_partial() -> None:
    result = await _run(ScriptedModel([final("half an ans", finish="length")]), _pool())
    assert result.partial and result.exit_code == 3


async def test_control_tools_are_offered_validated_and_can_end_the_turn() -> None:
    seen: list[tuple[dict[str, Any], str, int]] = []

    async def wait_for(arguments: Any, ctx: ControlContext) -> ControlResult:
        seen.append((dict(arguments), ctx.run_id, ctx.step))
        return ControlResult.text("armed", end_turn=True)

    registry = ControlToolRegistry()
    registry.register(ControlTool("await_resource", "wait", {"type": "object", "properties": {"uri": {"type": "string"}},
                                                             "required": ["uri"]}, wait_for))
    model = ScriptedModel([tools_reply(call("await_resource", {}), content="let me wait"),
                           tools_reply(call("await_resource", {"uri": "x://y"})), final("unreachable")])
    result = await _run(model, _pool(), controls=registry)
    offered = {t.name for t in model.requests[0][1]}
    assert {"s__add", "await_resource", "resource_read"} <= offered
    assert seen == [({"uri": "x://y"}, "run-1", 2)]
    assert result.status is RunStatus.COMPLETED and result.steps == 2 and result.result == "let me wait"


async def test_usage_hook_sees_every_increment() -> None:
    increments: list[tuple[Usage, int | None]] = []
    model = ScriptedModel([tools_reply(call("s__add", {"a": 1, "b": 1}), tokens=7), final("2", tokens=9)])
    await _run(model, _pool(), on_usage=lambda usage, cost: increments.append((usage, cost)))
    assert increments == [(Usage(7, 1), None), (Usage(9, 1), None)]  # not priced: no cost


async def test_intelligence_failure_mid_run() -> None:
    model = ScriptedModel([tools_reply(call("s__add", {"a": 1, "b": 1}), content="so far"),
                           IntelligenceError("all gateways down")])
    result = await _run(model, _pool())
    assert (result.status, result.exit_code, result.result, result.steps) == (
        RunStatus.INTELLIGENCE_FAILED, 4, "so far", 2)
    assert result.error == "all gateways down"


async def test_prompt_has_instructions_and_capped_resource_catalogue() -> None:
    pool = _pool()
    pool.instruction_texts = {"s": "Always add carefully."}
    pool.resource_list = [ResourceInfo("s", f"test://r/{i}", f"r{i}", "desc", "text/plain", i) for i in range(60)]
    model = ScriptedModel([final("ok")])
    await _run(model, pool)
    system = model.requests[0][0][0]["content"]
    assert 'Server "s"' in system and "Always add carefully." in system
    assert "uri=test://r/0; server=s; name=r0; mime=text/plain; size=0; description=desc" in system
    assert "test://r/49;" in system and "test://r/50;" not in system
    assert "showing 50 of 60 resources" in system
    assert model.requests[0][0][-1] == {"role": "user", "content": "add things"}


async def test_resource_read_listed_unlisted_and_missing() -> None:
    pool = _pool()
    pool.servers = ("a", "b")
    pool.resource_list = [ResourceInfo("b", "test://listed", "listed")]
    pool.bodies = {("b", "test://listed"): "listed body", ("b", "test://hidden"): "hidden body"}
    model = ScriptedModel([
        tools_reply(call("resource_read", {"uri": "test://listed"}, "r1"), call("resource_read", {"uri": "test://hidden"}, "r2"),
                    call("resource_read", {"uri": "test://missing"}, "r3"),
                    call("resource_read", {"uri": "test://listed", "server": "zzz"}, "r4")),
        final("read"),
    ])
    await _run(model, pool)
    listed, hidden, missing, bad_server = _tool_messages(model.requests[1][0])
    assert "listed body" in listed and "hidden body" in hidden
    assert missing.startswith("[tool error") and "not found" in missing
    assert "unknown server 'zzz'" in bad_server
    assert pool.reads[0] == ("test://listed", "b")  # the listing server first
    assert ("test://hidden", "a") in pool.reads and ("test://hidden", "b") in pool.reads  # tried everywhere


async def test_two_runs_in_one_process_do_not_interfere() -> None:
    results: dict[str, Any] = {}

    async def one(tag: str, n: int) -> None:
        pool = _pool()
        model = ScriptedModel([tools_reply(call("s__add", {"a": n, "b": n}))] * n + [final(tag)])
        log = EventLog(sink=lambda line: None, run_id=tag)
        results[tag] = (await run_with(RunRequest(tag, tag), pool=pool, intel=model, log=log), pool)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "alpha", 3)
        nursery.start_soon(one, "beta", 5)
    for tag, steps in (("alpha", 4), ("beta", 6)):
        result, pool = results[tag]
        assert (result.run_id, result.result, result.steps) == (tag, tag, steps)
        assert {c[3] for c in pool.calls} == {tag}


async def test_drain_stops_at_a_step_boundary_and_exits_0() -> None:
    from agentd.oversight.drain import DrainLatch, use_drain

    latch = DrainLatch()
    pool = _pool()

    async def drains(args: Any) -> Any:
        latch.request("SIGTERM")  # arrives while a tool call is in flight: the step still finishes
        return text_result("finished anyway")

    pool.add("s", "work", drains)
    model = ScriptedModel([tools_reply(call("s__work", {}), content="halfway"), final("never")])
    with use_drain(latch):
        result = await _run(model, pool)
    assert (result.status, result.steps, result.result, result.partial) == (RunStatus.CANCELLED, 1, "halfway", True)
    assert result.drained and result.exit_code == 0 and result.error == "drained (SIGTERM)"
    assert _tool_messages(model.requests[0][0]) == [] and len(pool.calls) == 1


def _offered(lines: list[dict[str, Any]]) -> list[str]:
    """The tools the loop's ``mcp.catalogue`` audit events named, in order."""
    return [item["tool"] for line in lines if line["event"] == "mcp.catalogue" for item in line["offered"]]


async def test_catalogue_is_rebuilt_only_when_the_tool_list_changes() -> None:
    pool = _pool()

    async def add_tool(args: Any) -> Any:
        pool.add("s", "fresh", _add, ADD_SCHEMA)  # as after notifications/tools/list_changed
        return text_result("added")

    pool.add("s", "grow", add_tool)
    model = ScriptedModel([tools_reply(call("s__add", {"a": 1, "b": 1})), tools_reply(call("s__grow", {})),
                           tools_reply(call("s__fresh", {"a": 2, "b": 2})), final("ok")])
    lines: list[dict[str, Any]] = []
    result = await _run(model, pool, lines=lines)
    assert result.status is RunStatus.COMPLETED and result.steps == 4
    offered = [{t.name for t in tools} for _, tools in model.requests]
    assert "s__fresh" not in offered[1] and "s__fresh" in offered[2]
    assert pool.calls[-1][:3] == ("s", "fresh", {"a": 2, "b": 2})
    audits = _offered(lines)
    assert audits == ["add", "grow", "add", "grow", "fresh"]  # one load at start, one after the change


async def test_runs_sharing_a_log_audit_an_unchanged_catalogue_once() -> None:
    """A daemon runs every wake on one log: descriptions are logged per catalogue load, not per run."""
    pool = _pool()
    lines: list[dict[str, Any]] = []
    log = EventLog(sink=lines.append, run_id="daemon")

    async def wake(n: int) -> list[str]:
        request = RunRequest("add things", f"daemon.{n}", Limits())
        result = await run_with(request, pool=pool, intel=ScriptedModel([final("ok")]), log=log.bind(run_id=f"d.{n}"))
        assert result.status is RunStatus.COMPLETED
        audits = _offered(lines)
        lines.clear()
        return audits

    assert await wake(1) == ["add"]
    assert await wake(2) == []  # same tool list: nothing new to audit
    pool.add("s", "fresh", _add, ADD_SCHEMA)  # as after notifications/tools/list_changed
    assert await wake(3) == ["add", "fresh"]
    assert await wake(4) == []
    other: list[dict[str, Any]] = []
    await run_with(RunRequest("add things", "other", Limits()), pool=pool, intel=ScriptedModel([final("ok")]),
                   log=EventLog(sink=other.append))
    assert _offered(other) == ["add", "fresh"]


async def test_old_observations_are_elided_to_bound_the_history() -> None:
    from agentd.agent.runner import MAX_HISTORY_OBSERVATION_CHARS

    pool = _pool()
    size = 30_000

    async def big(args: Any) -> Any:
        return text_result(str(args["n"]) * size)

    pool.add("s", "big", big, {"type": "object", "properties": {"n": {"type": "integer"}}})
    steps = MAX_HISTORY_OBSERVATION_CHARS // size + 3
    model = ScriptedModel([tools_reply(call("s__big", {"n": i % 10})) for i in range(steps)] + [final("done")])
    lines: list[dict[str, Any]] = []
    result = await _run(model, pool, limits=Limits(max_steps=steps + 1), lines=lines)
    assert result.status is RunStatus.COMPLETED
    observations = _tool_messages(model.requests[-1][0])
    assert len(observations) == steps
    kept = [o for o in observations if not o.startswith("[agentd elided")]
    assert sum(map(len, kept)) <= MAX_HISTORY_OBSERVATION_CHARS
    assert observations[-1] == str((steps - 1) % 10) * size  # the newest is always whole
    assert observations[0].startswith("[agentd elided this older observation (30000 characters)")
    final_line = next(line for line in lines if line["event"] == "loop.final")
    assert final_line["elided_observations"] == steps - len(kept)
