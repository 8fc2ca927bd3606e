"""``await_resource`` conditions: a JSON Pointer (RFC 6901) into a resource's content and a comparison.

The content is the resource's first text item, parsed as JSON when it parses and taken as a plain
string otherwise (so ``{"pointer": "", "op": "contains", "value": "DONE"}`` works on text files).
Comparisons are JSON's, not Python's: ``true`` is not ``1``, ``gt``/``lt`` compare two numbers or
two strings and are false for anything else, and every operator except ``exists`` is false when
the pointer does not resolve (a missing field is "not yet", never an error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from agentd.formats import jsontext as json_text

OPS: Final = ("exists", "eq", "ne", "gt", "lt", "contains")
_MISSING: Final = object()


class ConditionError(ValueError):
    """A malformed condition (bad pointer or operator); the tool reports it as ``isError``."""


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """Split an RFC 6901 pointer into unescaped reference tokens."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ConditionError(f"JSON pointer {pointer!r} must be empty or start with '/'")
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/"))


def resolve(document: Any, tokens: Sequence[str]) -> Any:
    """The value the pointer names, or ``_MISSING``."""
    node = document
    for token in tokens:
        if isinstance(node, Mapping):
            if token not in node:
                return _MISSING
            node = node[token]
        elif isinstance(node, list):
            if not token.isdigit() or (len(token) > 1 and token[0] == "0") or int(token) >= len(node):
                return _MISSING
            node = node[int(token)]
        else:
            return _MISSING
    return node


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


@attrs.frozen
class Condition:
    pointer: str
    op: str
    value: Any = None
    tokens: tuple[str, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if self.op not in OPS:
            raise ConditionError(f"unknown op {self.op!r}; expected one of {', '.join(OPS)}")
        object.__setattr__(self, "tokens", parse_pointer(self.pointer))

    @classmethod
    def from_arguments(cls, raw: Any) -> Condition:
        if not isinstance(raw, Mapping):
            raise ConditionError("condition must be an object {pointer, op, value?}")
        pointer, op = raw.get("pointer", ""), raw.get("op", "exists")
        if not isinstance(pointer, str) or not isinstance(op, str):
            raise ConditionError("condition.pointer and condition.op must be strings")
        if op != "exists" and "value" not in raw:
            raise ConditionError(f"condition op {op!r} needs a value")
        return cls(pointer, op, raw.get("value"))

    def holds(self, document: Any) -> bool:
        target = resolve(document, self.tokens)
        if target is _MISSING:
            return False
        match self.op:
            case "exists":
                return True
            case "eq":
                return json_equal(target, self.value)
            case "ne":
                return not json_equal(target, self.value)
            case "gt" | "lt":
                if (_is_number(target) and _is_number(self.value)) or (
                    isinstance(target, str) and isinstance(self.value, str)
                ):
                    return bool(target > self.value) if self.op == "gt" else bool(target < self.value)
                return False
            case _:  # contains
                if isinstance(target, str):
                    return isinstance(self.value, str) and self.value in target
                if isinstance(target, list):
                    return any(json_equal(item, self.value) for item in target)
                if isinstance(target, Mapping):
                    return isinstance(self.value, str) and self.value in target
                return False


def document_of(contents: Sequence[Mapping[str, Any]]) -> Any:
    """The value a condition is evaluated against: the first text item, as JSON if it parses."""
    for item in contents:
        text = item.get("text")
        if isinstance(text, str):
            try:
                return json_text.loads(text, "replace")
            except ValueError:
                return text
    return _MISSING
