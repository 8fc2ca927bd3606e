"""Compiling a tool list's schemas is bounded per schema and per list (agentd.agent.catalogue, agentd.mcp.schemas):
thousands of schemas each just under the one-schema budget must not hold the event loop thousands of times as
long. Counted in steps, so exact."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from agentd.agent.catalogue import build_catalogue
from agentd.mcp import schemas

pytestmark = pytest.mark.slow  # it spends a whole tool list's compile budget, twice (seconds)


@attrs.frozen
class Tool:
    server: str
    name: str
    description: str | None
    input_schema: Any


def _schema(i: int, width: int = 400) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}_{j}": {"type": "string", "minLength": 1} for j in range(width)}}


def test_one_schema_reports_its_cost_and_stops_at_its_budget() -> None:
    compiled = schemas.compile_schema(_schema(0))
    assert compiled.validator is not None and 0 < compiled.cost < schemas.COMPILE_BUDGET
    small = schemas.compile_schema(_schema(1), budget=compiled.cost // 2)
    assert small.validator is None and small.unusable is not None and "too large" in small.unusable


def test_a_tool_list_shares_one_budget_and_is_served_past_it() -> None:
    one = schemas.compile_schema(_schema(10_000)).cost
    count = schemas.LISTING_BUDGET // one + 3  # more new schemas than one list may compile
    tools = [Tool("s", f"t{i}", None, _schema(20_000 + i)) for i in range(count)]
    catalogue = build_catalogue(tools, [])
    unusable = [e for e in catalogue.entries.values() if e.unusable is not None]
    assert 1 <= len(unusable) <= 4, len(unusable)
    assert all("exceed agentd's budget for compiling them" in (e.unusable or "") for e in unusable)
    assert all(e.validator is not None for e in catalogue.entries.values() if e.unusable is None)
    # every tool is still offered; the next list compiles what this one could not (nothing was cached as unusable)
    assert len(catalogue.chat_tools) == count
    again = build_catalogue([Tool("s", t.name, None, dict(t.input_schema)) for t in tools], [])
    assert not [e for e in again.entries.values() if e.unusable is not None]
