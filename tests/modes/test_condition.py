import pytest

from agentd.modes.condition import Condition, ConditionError, document_of, parse_pointer, resolve

DOC = {"status": "done", "count": 3, "ok": True, "items": ["a", {"b": 1}], "a/b": 1, "m~n": 2, "": 9,
       "none": None}


def test_rfc6901_pointers() -> None:
    assert parse_pointer("") == ()
    assert parse_pointer("/a~1b") == ("a/b",)
    assert parse_pointer("/m~0n") == ("m~n",)
    assert parse_pointer("/~01") == ("~1",)  # ~01 unescapes to ~1, not /
    assert resolve(DOC, parse_pointer("/items/1/b")) == 1
    assert resolve(DOC, parse_pointer("/a~1b")) == 1
    assert resolve(DOC, parse_pointer("/")) == 9
    with pytest.raises(ConditionError):
        parse_pointer("status")


@pytest.mark.parametrize(
    ("pointer", "op", "value", "holds"),
    [
        ("/status", "exists", None, True),
        ("/missing", "exists", None, False),
        ("/none", "exists", None, True),
        ("/status", "eq", "done", True),
        ("/count", "eq", 3.0, True),
        ("/ok", "eq", 1, False),  # JSON: true is not 1
        ("/count", "eq", True, False),
        ("/status", "ne", "running", True),
        ("/missing", "ne", "x", False),  # a missing target satisfies nothing but exists
        ("/count", "gt", 2, True),
        ("/count", "lt", 3, False),
        ("/count", "gt", "2", False),  # mixed types never order
        ("/status", "gt", "a", True),
        ("/items", "contains", "a", True),
        ("/items", "contains", {"b": 1}, True),
        ("/status", "contains", "on", True),
        ("", "contains", "status", True),  # object: has key
        ("/items/0", "eq", "a", True),
        ("/items/01", "exists", None, False),  # leading zeros are not indices
        ("/items/-", "exists", None, False),
    ],
)
def test_ops(pointer: str, op: str, value: object, holds: bool) -> None:
    assert Condition(pointer, op, value).holds(DOC) is holds


def test_from_arguments_validates() -> None:
    assert Condition.from_arguments({"pointer": "/x", "op": "exists"}).tokens == ("x",)
    for bad in ({"pointer": "/x", "op": "matches", "value": 1}, {"pointer": "x", "op": "exists"},
                {"pointer": "/x", "op": "eq"}, "nope", {"pointer": 1, "op": "eq", "value": 1}):
        with pytest.raises(ConditionError):
            Condition.from_arguments(bad)


def test_document_of_parses_json_else_text() -> None:
    assert document_of([{"uri": "u", "text": '{"a": 1}'}]) == {"a": 1}
    assert document_of([{"uri": "u", "blob": "AA=="}, {"uri": "u", "text": "plain DONE"}]) == "plain DONE"
    assert Condition("", "contains", "DONE").holds(document_of([{"text": "plain DONE"}]))
    assert not Condition("", "exists").holds(document_of([{"blob": "AA=="}]))
