"""A daemon builds a catalogue per wake: the per-schema and name-map work is reused, never stale."""

from __future__ import annotations

import gc
import time
import weakref
from typing import Any

from agentd.agent import catalogue
from agentd.agent.catalogue import Catalogues, catalogues_for
from agentd.agent.control import ControlContext, ControlResult, ControlTool
from agentd.telemetry.events import EventLog
from tests.agent.test_catalogue import Tool, _noop


def _schema(i: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"}, "q": {"type": "string"}},
            "required": [f"p{i}"]}


def _audited(lines: list[dict[str, Any]]) -> int:
    """How many tools the ``mcp.catalogue`` audit events (one per catalogue load) named."""
    return sum(len(x["offered"]) for x in lines if x["event"] == "mcp.catalogue")


def test_rebuilt_catalogue_reuses_validators_and_logs_each_load_once() -> None:
    tools = [Tool("srv", f"t{i}", f"tool {i}", _schema(i)) for i in range(20)]
    control_schema = {"type": "object", "properties": {"uri": {"type": "string"}}}
    lines: list[dict[str, Any]] = []
    log = EventLog(sink=lines.append)
    cats = Catalogues()  # a pool's: a daemon's every wake builds from the same pool
    # Control tools are registered afresh per wake (new objects, same module-level schema).
    first = cats.build(tools, [ControlTool("resource.read", "read", control_schema, _noop)], log=log)
    second = cats.build(tools, [ControlTool("resource.read", "read", control_schema, _noop)], log=log)
    assert first is second  # no run's objects in it: one catalogue serves every wake offering the same tools
    for wire, entry in first.entries.items():
        assert second.entries[wire].validator is entry.validator
    assert [t.name for t in first.chat_tools] == [t.name for t in second.chat_tools]
    # Nothing per schema was redone: the prepared copies themselves are shared (and never mutated).
    assert all(a.parameters is b.parameters for a, b in zip(first.chat_tools, second.chat_tools, strict=True))
    # The audit record is per catalogue load (a new tool list), not per build: the same list is logged once.
    assert _audited(lines) == 20
    assert len([x for x in lines if x["event"] == "mcp.catalogue"]) == 1  # one event per load, not per tool
    # Re-listed but unchanged (new, equal objects): nothing new to audit. A changed list is a new load
    # and is audited again, and so is the same list on another sink (another daemon's log).
    cats.build([Tool(t.server, t.name, t.description, t.input_schema) for t in tools], [], log=log)
    assert _audited(lines) == 20
    changed = [*tools[:-1], Tool("srv", "t19", "a new description", _schema(19))]
    cats.build(changed, [], log=log)
    assert _audited(lines) == 40
    other: list[dict[str, Any]] = []
    cats.build(tools, [], log=EventLog(sink=other.append))
    assert _audited(other) == 20
    entry = second.resolve("srv__t3")
    assert entry is not None and entry.check({"p3": 1}) is None and "required" in (entry.check({}) or "")


def test_a_new_schema_object_is_compiled_for_itself() -> None:
    """The identity cache never hands one schema's validator to another (new list from the pool)."""
    cats = Catalogues()
    strict = Tool("srv", "t", "", {"type": "object", "required": ["a"]})
    loose = Tool("srv", "t", "", {"type": "object"})
    a = cats.build([strict], []).resolve("srv__t")
    b = cats.build([loose], []).resolve("srv__t")
    assert a is not None and b is not None
    assert a.check({}) is not None and b.check({}) is None
    # And a changed tool list changes the wire names the map hands out.
    both = cats.build([strict, Tool("other", "t", "", {})], [])
    assert set(both.entries) == {"srv__t", "other__t"}


def test_a_rebuilt_catalogue_costs_a_fraction_of_a_cold_one() -> None:
    """CPU, not wall time: the second build of the same tools must skip schema checks and serialisation."""
    tools = [Tool("srv", f"t{i}", "d", _schema(i)) for i in range(30)]
    cats = Catalogues()
    catalogue.VALIDATORS.clear()
    catalogue._name_map.cache_clear()
    start = time.process_time()
    cats.build(tools, [])
    cold = time.process_time() - start
    assert catalogue._name_map.cache_info().misses == 1
    start = time.process_time()
    for _ in range(10):
        cats.build(tools, [])
    warm = (time.process_time() - start) / 10
    assert catalogue._name_map.cache_info().misses == 1  # names, schemas and wire forms: built once
    assert warm < cold / 3, (warm, cold)


async def _other(arguments: Any, ctx: ControlContext) -> ControlResult:
    return ControlResult.text("other")


def test_a_shared_catalogue_follows_changed_control_tools() -> None:
    """A control tool registered anew with the same definition shares the catalogue; a changed one (description,
    schema) is offered as it is now, not as it was cached."""
    cats = Catalogues()
    tools = [Tool("srv", "t", "d", _schema(0))]
    schema = {"type": "object", "properties": {"uri": {"type": "string"}}}
    first = ControlTool("subscribe", "watch a URI", schema, _noop)
    second = ControlTool("subscribe", "watch a URI", schema, _other)  # the next wake's registry: same tool, anew
    assert cats.build(tools, [first]) is cats.build(tools, [second])
    changed = ControlTool("subscribe", "watch a URI now", {"type": "object"}, _noop)
    offered = {t.name: t for t in cats.build(tools, [changed]).chat_tools}
    assert offered["subscribe"].description == "watch a URI now"
    assert offered["subscribe"].parameters == {"type": "object"}


async def test_each_run_calls_its_own_control_tool_through_a_shared_catalogue() -> None:
    """Two runs offer a same-named control tool with different handlers (a wake's registry is built anew): each
    run's call reaches its own handler, though both runs were offered one shared catalogue."""
    from agentd.agent.control import ControlToolRegistry
    from agentd.agent.runner import RunRequest
    from agentd.run import run_with
    from tests.agent.scripted import MemoryPool, ScriptedModel, call, final, tools_reply

    schema = {"type": "object", "properties": {}}
    answers: list[str] = []
    pool = MemoryPool()  # one pool for both runs, as a daemon's wakes have: one Catalogues, one catalogue
    for answer in ("from the first run", "from the second run"):
        async def handler(arguments: Any, ctx: ControlContext, answer: str = answer) -> ControlResult:
            return ControlResult.text(answer)

        registry = ControlToolRegistry()
        registry.register(ControlTool("probe", "answers", schema, handler))
        model = ScriptedModel([tools_reply(call("probe", {})), final("done")])
        await run_with(RunRequest("go", f"run-{len(answers)}"), pool=pool, intel=model,
                       log=EventLog(sink=lambda line: None), controls=registry)
        answers.append(next(m["content"] for m in model.requests[1][0] if m["role"] == "tool"))
    assert answers == ["from the first run", "from the second run"]


def test_tools_json_follows_the_tools_offered() -> None:
    """The identity fast path never hands one catalogue's ``tools`` JSON to another."""
    from agentd.intelligence.wire import ChatTool, tools_json

    one = (ChatTool("a", "first", {"type": "object"}),)
    two = (ChatTool("b", "second", {"type": "object"}),)
    assert '"name":"a"' in tools_json(one)
    assert '"name":"b"' in tools_json(two)
    assert '"name":"a"' in tools_json(one)
    assert tools_json(list(two)) == tools_json(two)


def test_resource_awareness_follows_a_relisted_pool() -> None:
    """The awareness list is reused for the same resource objects and rebuilt for a new listing."""
    from agentd.agent.prompt import resource_catalogue
    from agentd.client.models import ResourceInfo

    before = [ResourceInfo("srv", "test://a", "old name")]
    after = [ResourceInfo("srv", "test://a", "new name")]
    assert "name=old name" in resource_catalogue(before)
    assert "name=new name" in resource_catalogue(after)
    assert resource_catalogue(before) == resource_catalogue(list(before))
    many = [ResourceInfo("srv", f"test://{i}", f"r{i}") for i in range(3)]
    assert "(showing 2 of 3 resources" in resource_catalogue(many, 2)
    assert "showing" not in resource_catalogue(many[:2], 2)


def test_a_pools_catalogues_live_as_long_as_the_pool() -> None:
    """One :class:`Catalogues` per pool: the same for every run on it, another for another pool, gone with it."""
    from tests.agent.scripted import MemoryPool

    pool, other = MemoryPool(), MemoryPool()
    cats = catalogues_for(pool)
    assert catalogues_for(pool) is cats and catalogues_for(other) is not cats
    owned = weakref.ref(cats)
    del cats, pool
    gc.collect()
    assert owned() is None
