"""Distillation: turning the model's final message into a bounded result a caller can parse.

A parent (a CLI user, a harness, a supervising agent) must get a clean, bounded answer, never a
transcript. With an output contract the model is told exactly what to return and its JSON answer is
parsed (tolerating a Markdown code fence or prose around one JSON value); without one the text is the
result. Either way the serialised result is capped at :data:`MAX_RESULT_CHARS` (about 2k tokens);
a cut result is marked ``partial``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from agentd.deferred.patterns import Pattern
from agentd.formats import jsontext as json_text

MAX_RESULT_CHARS = 8000
_TRUNCATION_MARK = "…[truncated]"
_FENCE = Pattern(r"```(?:json|JSON)?\s*\n(.*?)\n?```", re.DOTALL)


@attrs.frozen
class Distillate:
    """A bounded result. ``parsed`` is false when a contract asked for JSON and none was found."""

    value: Any
    partial: bool = False
    parsed: bool = True


def contract_instruction(output_contract: str) -> str:
    """The prompt paragraph that tells the model exactly what its final answer must be."""
    return (
        "Output contract. When you are done, reply with no tool calls and a final message that is a single "
        "JSON value (no prose, no code fence) satisfying this contract:\n"
        f"{output_contract}\n"
        f"Keep it under {MAX_RESULT_CHARS} characters."
    )


def parse_json_answer(text: str) -> tuple[bool, Any]:
    """Find the one JSON value the model answered with; ``(False, None)`` if there is none."""
    stripped = text.strip()
    candidates = [stripped]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    for candidate in candidates:
        try:
            return True, json_text.loads(candidate, "replace")
        except ValueError:
            pass
    # Prose around a value: decode from the first bracket that yields a complete JSON value.
    decoder = json.JSONDecoder()
    for index, char in enumerate(stripped):
        if char in "{[":
            try:
                value, _ = decoder.raw_decode(stripped, index)
            except ValueError:
                continue
            return True, json_text.apply(value, "replace")
    return False, None


def structured_answer(value: Any) -> Any:
    """A subagent's result as its parent receives it: an answer that *is* one JSON object or array (the whole
    text, or the whole text as one fenced block) is handed on as that value, not as a string holding it.
    Anything else (prose, a scalar, a cut answer) is passed on unchanged."""
    if not isinstance(value, str):
        return value
    stripped = value.strip()
    fenced = _FENCE.fullmatch(stripped)
    candidate = fenced.group(1).strip() if fenced is not None else stripped
    if not candidate.startswith(("{", "[")):
        return value
    try:
        parsed = json_text.loads(candidate, "replace")
    except ValueError:
        return value
    return parsed if isinstance(parsed, dict | list) else value


def distill(
    text: str | None, *, output_contract: str | None = None, limit: int = MAX_RESULT_CHARS
) -> Distillate:
    """Bound the final answer; parse it as JSON when a contract asked for JSON."""
    if text is None:
        return Distillate(None, partial=False, parsed=output_contract is None)
    if output_contract is not None:
        ok, value = parse_json_answer(text)
        if ok:
            if len(json.dumps(value, ensure_ascii=False)) <= limit:
                return Distillate(value)
            # Too big to pass on whole: hand over the serialised prefix, marked partial.
            return Distillate(_cut(json.dumps(value, ensure_ascii=False), limit), partial=True)
        return Distillate(_cut(text, limit), partial=len(text) > limit, parsed=False)
    return Distillate(_cut(text, limit), partial=len(text) > limit)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - len(_TRUNCATION_MARK)] + _TRUNCATION_MARK
