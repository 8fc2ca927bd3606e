"""Checking a value against a peer's JSON Schema is bounded by one budget per check (agentd.mcp.schemas).

Each case is one that ran for seconds to minutes unbounded; here each must end with an answer (valid,
invalid, or :class:`CheckTooCostly`) and the same answers as jsonschema where jsonschema would finish. No
timing: the budget is counted in steps, so these are exact.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentd.mcp import schemas

DRAFT4 = "http://json-schema.org/draft-04/schema#"


def _check(schema: dict[str, Any], instance: Any, **kwargs: Any) -> str | None:
    compiled = schemas.compile_schema(schema)
    assert compiled.validator is not None, (compiled.error, compiled.unusable)
    error = schemas.first_errors(compiled.validator, instance, **kwargs)
    return error[0].message if error else None


@pytest.mark.parametrize(("items", "unique"), [
    ([1, 2, 3], True),
    ([1, 1.0], False),  # JSON Schema equality: one number
    ([True, 1], True),  # a boolean is not a number
    ([{"a": 1, "b": 2}, {"b": 2, "a": 1}], False),  # key order does not matter
    ([[1, 2], [2, 1]], True),  # item order does
    ([{"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}], False),
    (["a", "b", "a"], False),
    ([None, False, 0, "", [], {}], True),
])
def test_unique_items_matches_json_schema_equality(items: list[Any], unique: bool) -> None:
    message = _check({"type": "array", "uniqueItems": True}, items)
    assert (message is None) is unique, message
    if not unique:
        assert message is not None and message.startswith("has non-unique elements")


def test_unique_items_over_many_objects_is_linear_and_bounded() -> None:
    """Pairwise comparison of 30000 distinct objects was ~450 million comparisons; now it is a set, within the
    budget for thousands and refused, not run, past it."""
    assert _check({"type": "array", "uniqueItems": True}, [{"k": i} for i in range(3000)]) is None
    with pytest.raises(schemas.CheckTooCostly, match="comparing values exceeds the budget"):
        _check({"type": "array", "uniqueItems": True}, [{"k": i, "v": [i]} for i in range(30000)])


def test_a_long_property_name_against_a_polynomial_pattern_stops_the_check() -> None:
    schema = {"type": "object", "patternProperties": {"^a*a*a*a*$": {"type": "string"}}}
    assert _check(schema, {"aaaa": 1}) == "1 is not of type 'string'"
    assert _check(schema, {"b" * 20: 1}) is None
    with pytest.raises(schemas.CheckTooCostly, match="property name of 3001 characters is too long"):
        _check(schema, {"a" * 3000 + "!": "x"})
    # additionalProperties and unevaluatedProperties match names against the same patterns
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        with pytest.raises(schemas.CheckTooCostly, match="too long to match"):
            _check({**schema, keyword: False}, {"a" * 3000 + "!": "x"})


def test_many_strings_against_a_polynomial_pattern_share_one_budget() -> None:
    schema = {"type": "array", "items": {"type": "string", "pattern": "^a*a*a*a*$"}}
    assert _check(schema, ["a" * 24 + "!"]) == "'aaaaaaaaaaaaaaaaaaaaaaaa!' does not match '^a*a*a*a*$'"
    with pytest.raises(schemas.CheckTooCostly, match="pattern exceeds the budget"):
        _check(schema, ["a" * 25] * 3000)  # each matches (no error stops the check early)
    # an anchored single repetition is linear: thousands of long strings fit
    assert _check({"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}}, ["abc" * 100] * 3000) is None


def test_a_subschema_naming_another_dialect_is_bounded_too() -> None:
    """jsonschema picks a subschema's class by its own ``$schema``: that class must be bounded as well."""
    schema = {"type": "object", "properties": {"xs": {"$schema": DRAFT4, "type": "array", "uniqueItems": True}}}
    assert _check(schema, {"xs": [{"a": 1}, {"a": 1}]}) is not None
    with pytest.raises(schemas.CheckTooCostly):
        _check(schema, {"xs": [{"k": i, "v": [i]} for i in range(30000)]})


def test_the_metaschema_check_is_bounded() -> None:
    """A draft-04 schema's ``enum`` must be unique by its metaschema: 3000 objects were checked pairwise."""
    compiled = schemas.compile_schema({"$schema": DRAFT4, "enum": [{"a": i} for i in range(3000)]})
    assert compiled.validator is not None and compiled.error is None
    duplicate = schemas.compile_schema({"$schema": DRAFT4, "enum": [{"a": 1}, {"a": 1}]})
    assert duplicate.validator is None and duplicate.error is not None


def test_messages_quoting_the_value_are_cut_and_charged() -> None:
    """jsonschema quotes the whole value in many messages: they are cut, and their cost counts."""
    message = _check({"type": "string"}, list(range(10000)))
    assert message is not None and len(message) <= schemas.MAX_MESSAGE_CHARS + 1 and message.endswith("…")
    with pytest.raises(schemas.CheckTooCostly, match="error messages exceeds the budget"):
        _check({"anyOf": [{"type": "string"}] * 1000}, list(range(100000)))


def test_every_keyword_is_charged() -> None:
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0}}
    assert _check(schema, list(range(100))) is None
    with pytest.raises(schemas.CheckTooCostly, match="exceeds the budget of one check"):
        _check(schema, list(range(100)), budget=50_000)


def test_enum_and_const_are_charged_by_size() -> None:
    with pytest.raises(schemas.CheckTooCostly, match="enum exceeds the budget"):
        _check({"enum": [list(range(1000))] * 100}, [*range(999), 5])
    assert _check({"const": [1, {"a": 2}]}, [1.0, {"a": 2}]) is None
