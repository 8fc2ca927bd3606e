"""The catalogue: server-qualified wire names that map back exactly, and argument validation."""

from __future__ import annotations

from typing import Any

import attrs

from agentd.agent.catalogue import build_catalogue
from agentd.agent.control import ControlContext, ControlResult, ControlTool
from agentd.telemetry.events import EventLog


@attrs.frozen
class Tool:
    server: str
    name: str
    description: str | None
    input_schema: dict[str, Any]


async def _noop(arguments: Any, ctx: ControlContext) -> ControlResult:
    return ControlResult.text("ok")


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_names_are_qualified_and_map_back() -> None:
    tools = [Tool("fs", "search", "d1", SCHEMA), Tool("web", "search", "d2", SCHEMA), Tool("x", "a.b/c", None, {})]
    control = ControlTool("resource.read", "read", {"type": "object"}, _noop)
    cat = build_catalogue(tools, [control])
    names = [t.name for t in cat.chat_tools]
    assert names[:2] == ["fs__search", "web__search"]
    assert all(len(n) <= 64 and n.replace("_", "").replace("-", "").isalnum() for n in names)
    for tool in tools:
        entry = next(e for e in cat.entries.values() if (e.server, e.name) == (tool.server, tool.name))
        assert cat.resolve(entry.wire_name) is entry
    control_entry = next(e for e in cat.entries.values() if e.name == "resource.read")
    assert control_entry.server is None  # a control tool: the run calls its own registry's tool by this name
    assert cat.resolve("nope__nothing") is None


def test_validation_messages() -> None:
    cat = build_catalogue([Tool("s", "t", "", SCHEMA)], [])
    entry = cat.resolve("s__t")
    assert entry is not None
    assert entry.check({"a": 1}) is None
    assert "required" in (entry.check({}) or "")
    assert "integer" in (entry.check({"a": "x"}) or "")


def test_broken_schema_offers_tool_without_validation_and_is_logged() -> None:
    lines: list[dict[str, Any]] = []
    log = EventLog(sink=lines.append)
    cat = build_catalogue([Tool("s", "t", "desc", {"type": 12})], [], log=log)
    entry = cat.resolve("s__t")
    assert entry is not None and entry.validator is None and entry.check({"anything": 1}) is None
    (audit,) = [line for line in lines if line["event"] == "mcp.catalogue"]
    (item,) = audit["offered"]
    assert audit["level"] == "warn" and "schema_error" in item and item["wire_name"] == "s__t"
    assert item["description"] == 4  # length only without --log-content
