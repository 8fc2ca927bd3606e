"""The offline ``test`` model: deterministic, stateless, calls each server tool once, then summarises."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from agentd.intelligence import OFFLINE_MODEL_NAME, ChatTool, ModelReply, example_value, open_intelligence
from agentd.intelligence.offline import OfflineIntelligence
from agentd.telemetry.events import EventLog

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"message": {"type": "string", "description": "to echo"}},
        "required": ["message"],
    },
    {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
    {
        "type": "object",
        "properties": {
            "duration": {"type": "number", "default": 10},
            "steps": {"type": "integer", "minimum": 3, "maximum": 5},
        },
        "required": ["steps"],
    },
    {
        "type": "object",
        "properties": {
            "mode": {"enum": ["fast", "slow"]},
            "flag": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            "url": {"type": "string", "format": "uri"},
            "code": {"type": "string", "minLength": 10},
        },
        "required": ["mode", "flag", "tags", "url", "code"],
    },
    {
        "type": "object",
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
        "properties": {
            "p": {"$ref": "#/$defs/Point"},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "string"}]},
            "n": {"type": ["null", "integer"], "exclusiveMinimum": 5},
        },
        "required": ["p", "maybe", "n"],
    },
    {"type": "object"},
    {},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_generated_arguments_validate(schema: dict[str, Any]) -> None:
    value = example_value(schema or {"type": "object"})
    jsonschema.validate(value, schema)
    assert isinstance(value, dict)


def test_defaults_and_enums_are_used() -> None:
    assert example_value(SCHEMAS[2]) == {"steps": 3, "duration": 10}
    assert example_value(SCHEMAS[3])["mode"] == "fast"


def _drive(tools: list[ChatTool], results: dict[str, str]) -> tuple[list[dict[str, Any]], ModelReply, int]:
    """Play the loop: feed each tool call's scripted result back until the model answers."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be useful"},
        {"role": "user", "content": "check the tools"},
    ]
    for steps in range(1, 20):
        reply = OfflineIntelligence.decide(messages, tools)
        assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
        if not reply.tool_calls:
            return messages, reply, steps
        assert len(reply.tool_calls) == 1
        (call,) = reply.tool_calls
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call.id, "content": results[call.name]})
    raise AssertionError("the offline model never answered")


def test_calls_every_server_tool_once_then_summarises() -> None:
    tools = [ChatTool(f"srv__tool{i}", "untrusted description", schema) for i, schema in enumerate(SCHEMAS)]
    tools.insert(
        2,
        ChatTool(
            "resource_read",
            "control tool",
            {"type": "object", "required": ["uri"], "properties": {"uri": {"type": "string"}}},
        ),
    )
    results = {t.name: f"result of {t.name}" for t in tools}
    results["srv__tool1"] = json.dumps(
        {"isError": True, "content": [{"type": "text", "text": "division by zero"}]}
    )
    results["srv__tool2"] = "Error: tool failed"
    results["srv__tool3"] = "[tool error: the tool ran and reported a failure]\nno such file"
    results["srv__tool4"] = "[agentd rejected this call; it was not sent] bad arguments"
    messages, final, steps = _drive(tools, results)
    assert steps == len(SCHEMAS) + 1
    called = [m["tool_calls"][0] for m in messages if m.get("tool_calls")]
    assert [c["function"]["name"] for c in called] == [f"srv__tool{i}" for i in range(len(SCHEMAS))]
    assert len({c["id"] for c in called}) == len(called)
    for call, schema in zip(called, SCHEMAS, strict=True):
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
    assert final.finish_reason == "stop"
    summary = json.loads(final.content or "")
    assert summary["model"] == OFFLINE_MODEL_NAME
    assert "not a language model" in summary["notice"]
    assert summary["tools_called"] == len(SCHEMAS)
    assert summary["observed"]["srv__tool0"] == {"isError": False, "text": "result of srv__tool0"}
    assert summary["observed"]["srv__tool1"] == {"isError": True, "text": "division by zero"}
    assert summary["observed"]["srv__tool2"]["isError"] is True
    assert summary["observed"]["srv__tool3"] == {"isError": True, "text": "no such file"}
    assert summary["observed"]["srv__tool4"]["isError"] is True
    assert summary["observed"]["srv__tool5"]["isError"] is False
    assert "resource_read" not in summary["observed"]


def test_is_deterministic_and_stateless() -> None:
    tools = [ChatTool("a__x", "", SCHEMAS[0]), ChatTool("b__y", "", SCHEMAS[1])]
    history = [{"role": "user", "content": "go"}]
    assert OfflineIntelligence.decide(history, tools) == OfflineIntelligence.decide(history, tools)
    run1 = _drive(tools, {"a__x": "1", "b__y": "2"})
    run2 = _drive(tools, {"a__x": "1", "b__y": "2"})
    assert run1 == run2


def test_no_server_tools_means_an_immediate_answer() -> None:
    reply = OfflineIntelligence.decide(
        [{"role": "user", "content": "hi"}], [ChatTool("resource_read", "", {})]
    )
    assert reply.tool_calls == ()
    assert json.loads(reply.content or "")["observed"] == {}


async def test_open_intelligence_test_selects_the_offline_model() -> None:
    lines: list[dict[str, Any]] = []
    async with open_intelligence("test", log=EventLog(sink=lines.append)) as intel:
        assert intel.model == OFFLINE_MODEL_NAME
        reply = await intel.complete([{"role": "user", "content": "hi"}], [ChatTool("s__t", "", SCHEMAS[0])])
    assert reply.tool_calls[0].name == "s__t"
    assert intel.usage == reply.usage
    assert [line["event"] for line in lines] == ["intel.call", "intel.result"]
    assert lines[0]["endpoint"] == "test"


def test_a_hostile_schema_gets_a_bounded_value() -> None:
    """A server's ``minLength: 1e9`` once made the offline model write 3.8 GiB; ``minimum: 1e999`` decodes to
    infinity, which no JSON number is. The value is bounded (and agentd's own check then refuses the call)."""
    text = example_value({"type": "string", "minLength": 10**9})
    assert isinstance(text, str) and len(text) == 4096
    assert example_value({"type": "integer", "minimum": json.loads("1e999")}) == 1
    assert example_value({"type": "number", "exclusiveMinimum": json.loads("-1e999")}) == 1
