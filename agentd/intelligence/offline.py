"""``--intelligence test``: a deterministic stand-in for a model, for smoke tests and demos.

It is not a language model and says so. Reading only the messages it is given (it keeps no state), it
calls each offered server tool (wire names containing ``__``; control tools are skipped) once, one call
per reply, with arguments generated from the tool's schema; when every tool has been called it answers
with a JSON summary of what it observed: for each tool, whether the result was an error and a short text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from agentd.formats import jsontext as json_text
from agentd.formats.tool_separator import SEPARATOR
from agentd.intelligence.wire import ChatTool, ModelReply, ToolCall, Usage
from agentd.telemetry.events import EventLog

MODEL_NAME: Final = "agentd-offline-test"
NOTICE: Final = "agentd offline test model: deterministic, not a language model"
_SUMMARY_TEXT: Final = 200
_MAX_DEPTH: Final = 8
#: Longest string it writes: a schema's ``minLength: 1e9`` gets this many characters, not a gigabyte (the
#: call is then refused by agentd's own check of the arguments, as a model's would be).
_MAX_STRING: Final = 4096
_ERROR_LABEL: Final = "[tool error"
_FAILURE_PREFIXES: Final = ("error", "[error", "[agentd rejected", "[agentd tool fault")


def _resolve(schema: Any, root: Mapping[str, Any], depth: int) -> Mapping[str, Any]:
    """Follow a local ``$ref`` (``#/$defs/X``, ``#/definitions/X``); anything else is taken as is."""
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str) and depth < _MAX_DEPTH:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            return {}
        target: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, Mapping) else None
        schema = target
        depth += 1
    return schema if isinstance(schema, Mapping) else {}


def example_value(schema: Any, root: Mapping[str, Any] | None = None, depth: int = 0) -> Any:
    """A value that satisfies the common cases of ``schema``: default, const, first enum, then by type."""
    root = root if root is not None else (schema if isinstance(schema, Mapping) else {})
    schema = _resolve(schema, root, depth)
    if depth > _MAX_DEPTH:
        return None
    if "default" in schema:
        return schema["default"]
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if isinstance(schema.get("examples"), list) and schema["examples"]:
        return schema["examples"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            usable = [o for o in options if _resolve(o, root, depth).get("type") != "null"] or options
            return example_value(usable[0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        return _example_object(schema, root, depth)
    if kind == "array":
        count = schema.get("minItems", 0)
        count = count if isinstance(count, int) and 0 <= count <= 16 else 0
        return [example_value(schema.get("items", {}), root, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        return _example_number(schema, integer=kind == "integer")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return _example_string(schema)


def _example_object(schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
    value: dict[str, Any] = {}
    for name in names:
        value[name] = example_value(properties.get(name, {}), root, depth + 1)
    # Optional properties with a default are filled in too: the tool would assume them anyway.
    for name, sub in properties.items():
        if name not in value and isinstance(sub, Mapping) and "default" in sub:
            value[name] = sub["default"]
    return value


def _example_number(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    def numeric(key: str) -> float | None:
        value = schema.get(key)
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    value: float = 1
    low, high, above = numeric("minimum"), numeric("maximum"), numeric("exclusiveMinimum")
    if low is not None:
        value = max(value, low)
    if above is not None and value <= above:
        value = above + 1
    if high is not None and value > high:
        value = high
    if not math.isfinite(value):  # "minimum": 1e999 decodes to infinity, which no JSON number is
        value = 1
    return math.ceil(value) if integer else value


def _example_string(schema: Mapping[str, Any]) -> str:
    formats = {
        "uri": "https://example.com/",
        "url": "https://example.com/",
        "email": "test@example.com",
        "date-time": "2026-01-01T00:00:00Z",
        "date": "2026-01-01",
        "time": "00:00:00Z",
        "uuid": "00000000-0000-4000-8000-000000000000",
        "ipv4": "127.0.0.1",
        "ipv6": "::1",
        "hostname": "example.com",
    }
    text = formats.get(str(schema.get("format", "")), "test")
    low = schema.get("minLength")
    high = schema.get("maxLength")
    if isinstance(low, int) and len(text) < low:
        text = text + "x" * (min(low, _MAX_STRING) - len(text))
    if isinstance(high, int) and len(text) > high:
        text = text[: max(high, 0)]
    return text


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type", "text") == "text"
        )
    return "" if content is None else json.dumps(content)


def _observation(content: Any) -> dict[str, Any]:
    """What a tool message says: its error flag and a short text.

    Understands the loop's labels (``[tool error: …]`` heads an ``isError`` result; a rejected or faulted
    call is an error too), a JSON object with ``isError``/``is_error``, and plain text starting ``error``.
    """
    text = _text_of(content)
    is_error = False
    try:
        parsed = json_text.loads(text, "replace")
    except ValueError:
        parsed = None
    if isinstance(parsed, Mapping):
        flag = parsed.get("isError", parsed.get("is_error"))
        is_error = bool(flag)
        inner = parsed.get("content")
        if isinstance(inner, list):
            text = _text_of(inner) or text
        elif isinstance(parsed.get("text"), str):
            text = parsed["text"]
    elif text.startswith(_ERROR_LABEL):
        is_error = True
        text = text.partition("\n")[2] or text
    else:
        lowered = text.lower()
        is_error = lowered.startswith(_FAILURE_PREFIXES)
    return {"isError": is_error, "text": text[:_SUMMARY_TEXT]}


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


class OfflineIntelligence:
    """Same interface as the gateway client; answers from the message history alone.
    (A plain class: a once run builds it at start-up, where an attrs class costs about a millisecond of CPU.)"""

    __slots__ = ("log", "model", "usage")

    def __init__(self, log: EventLog, model: str = MODEL_NAME) -> None:
        self.log = log
        self.model = model
        self.usage = Usage()

    async def complete(self, messages: list[dict[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        self.log.info(
            "intel.call",
            endpoint="test",
            model=MODEL_NAME,
            attempt=1,
            messages=len(messages),
            tools=len(tools),
            stream=False,
        )
        reply = self.decide(messages, tools)
        self.usage += reply.usage
        self.log.info(
            "intel.result",
            endpoint="test",
            finish_reason=reply.finish_reason,
            tool_calls=len(reply.tool_calls),
            content=self.log.content(reply.content or ""),
            prompt_tokens=reply.usage.prompt_tokens,
            completion_tokens=reply.usage.completion_tokens,
            elapsed_ms=0.0,
        )
        return reply

    @staticmethod
    def decide(messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        """The whole model: a pure function of the history and the offered tools."""
        called: dict[str, str] = {}  # tool_call_id -> tool name
        order: list[str] = []
        results: dict[str, Any] = {}
        for message in messages:
            if message.get("role") == "assistant":
                for call in message.get("tool_calls") or []:
                    function = call.get("function") or {}
                    name = function.get("name")
                    if isinstance(name, str):
                        called[str(call.get("id"))] = name
                        if name not in order:
                            order.append(name)
            elif message.get("role") == "tool":
                results[str(message.get("tool_call_id"))] = message.get("content")
        prompt_tokens = _tokens(json.dumps(list(messages), default=str)) + sum(
            _tokens(json.dumps(attrs.asdict(t), default=str)) for t in tools
        )
        for tool in tools:
            if SEPARATOR in tool.name and tool.name not in order:
                arguments = json.dumps(
                    example_value(tool.parameters or {"type": "object"}), separators=(",", ":")
                )
                call = ToolCall(id=f"call_{len(called) + 1}", name=tool.name, arguments=arguments)
                return ModelReply(
                    content=None,
                    tool_calls=(call,),
                    usage=Usage(prompt_tokens, _tokens(tool.name + arguments)),
                    finish_reason="tool_calls",
                )
        observed: dict[str, Any] = {}
        for call_id, name in called.items():
            if name in observed:
                continue
            observed[name] = (
                _observation(results[call_id])
                if call_id in results
                else {"isError": True, "text": "no result"}
            )
        answer = json.dumps(
            {"model": MODEL_NAME, "notice": NOTICE, "tools_called": len(observed), "observed": observed},
            ensure_ascii=False,
        )
        return ModelReply(
            content=answer, tool_calls=(), usage=Usage(prompt_tokens, _tokens(answer)), finish_reason="stop"
        )
