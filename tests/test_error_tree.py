"""The error tree drawn in agentd/errors.py's docstring is the real one: every AgentdError class of the module is
drawn, under its parent, with the exit code it carries (the one picture of the exit-code contract)."""

from __future__ import annotations

import inspect
import re

from agentd import errors


def _drawn() -> dict[str, tuple[str | None, int]]:
    """Each drawn class: its parent in the drawing and its exit code."""
    doc = errors.__doc__ or ""
    rows = [line for line in doc.splitlines() if re.match(r"\s{4}[\s│├└─]*[A-Z]\w+\s+\d+\s", line)]
    out: dict[str, tuple[str | None, int]] = {}
    stack: list[tuple[int, str]] = []
    for row in rows:
        found = re.match(r"(\s{4}[\s│├└─]*)([A-Z]\w+)\s+(\d+)", row)
        assert found is not None
        depth = len(found.group(1))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        out[found.group(2)] = (stack[-1][1] if stack else None, int(found.group(3)))
        stack.append((depth, found.group(2)))
    return out


def test_every_error_class_is_drawn_under_its_parent_with_its_exit_code() -> None:
    real = {name: cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, errors.AgentdError)}
    drawn = _drawn()
    assert set(drawn) == set(real)
    for name, cls in real.items():
        parent = cls.__bases__[0].__name__ if cls is not errors.AgentdError else None
        assert drawn[name] == (parent, int(cls.exit_code)), name
