"""The sans-io wire: request bodies, reply parsing, stream assembly, endpoint URLs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentd.errors import ConfigError
from agentd.intelligence.endpoints import completions_url, display, parse_endpoints
from agentd.intelligence.gateway import parse_retry_after
from agentd.intelligence.wire import (
    ChatTool,
    MalformedReply,
    ModelReply,
    StreamAssembler,
    ToolCall,
    Usage,
    encode_request,
    parse_completion,
    request_body,
    tools_json,
    uses_max_completion_tokens,
)
from tests.peers.gateway import completion_body, stream_events


def test_usage_adds_and_totals() -> None:
    total = Usage(3, 4) + Usage(10, 1)
    assert total == Usage(13, 5)
    assert total.total == 18
    assert sum([Usage(1, 1), Usage(2, 2)], Usage()) == Usage(3, 3)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-5", True),
        ("gpt-5-mini", True),
        ("gpt-5.1", True),
        ("o1", True),
        ("o1-preview", True),
        ("o3-mini", True),
        ("o4-mini", True),
        ("openai/o3", True),
        ("gpt-4o", False),
        ("default", False),
        ("llama3", False),
        ("o10", False),
        ("gpt-4.1", False),
    ],
)
def test_output_cap_key_by_family(model: str, expected: bool) -> None:
    assert uses_max_completion_tokens(model) is expected
    body = request_body(model, [], [], stream=False)
    key, other = (
        ("max_completion_tokens", "max_tokens") if expected else ("max_tokens", "max_completion_tokens")
    )
    assert body[key] == 4096
    assert other not in body


def test_request_body_tools_and_stream() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    body = request_body(
        "m", [{"role": "user", "content": "hi"}], [ChatTool("s__t", "desc", schema)], stream=True
    )
    assert body["tools"] == [
        {"type": "function", "function": {"name": "s__t", "description": "desc", "parameters": schema}}
    ]
    assert body["tool_choice"] == "auto"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    plain = request_body("m", [], [], stream=False)
    assert "tools" not in plain and "tool_choice" not in plain and "stream" not in plain


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["m", "o3-mini"])
def test_encoded_request_is_exactly_the_dumped_body(model: str, stream: bool) -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string", "description": "é ✓"}}}
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "naïve \"quoted\"\n"}]
    for tools in ([], [ChatTool("s__t", "desc", schema), ChatTool("ctl", "", {})]):
        expected = json.dumps(request_body(model, messages, tools, stream=stream), ensure_ascii=False,
                              separators=(",", ":")).encode()
        assert encode_request(model, messages, tools, stream=stream) == expected


def test_tools_json_is_reused_per_catalogue_and_never_confused() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    first = tools_json([ChatTool("s__t", "d", schema)])
    assert tools_json([ChatTool("s__t", "d", schema)]) is first  # same schema object: the cached text
    other = {"type": "object", "properties": {"b": {"type": "string"}}}
    assert '"b"' in tools_json([ChatTool("s__t", "d", other)])  # another schema object: encoded afresh
    assert '"new"' in tools_json([ChatTool("s__t", "new", schema)])  # another description
    assert json.loads(first) == [{"type": "function", "function": {"name": "s__t", "description": "d",
                                                                     "parameters": schema}}]


def test_parse_completion_variants() -> None:
    reply = parse_completion(completion_body({"tool_calls": [{"name": "a__b", "arguments": {"x": 1}}]}, "m"))
    assert reply.tool_calls == (ToolCall("call_1", "a__b", '{"x": 1}'),)
    assert reply.finish_reason == "tool_calls"
    assert reply.usage == Usage(10, 5)
    parts = {
        "choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}],
        "usage": {"input_tokens": 7, "output_tokens": 2},
    }
    assert parse_completion(parts) == ModelReply("ab", (), Usage(7, 2), None)
    no_args = {"choices": [{"message": {"tool_calls": [{"id": "x", "function": {"name": "n"}}]}}]}
    assert parse_completion(no_args).tool_calls == (ToolCall("x", "n", "{}"),)


@pytest.mark.parametrize(
    "body",
    [
        [],
        {},
        {"choices": []},
        {"choices": [{}]},
        {"choices": [{"message": {"content": 5}}]},
        {"choices": [{"message": {"tool_calls": {}}}]},
        {"choices": [{"message": {"tool_calls": [{"function": {"arguments": "{}"}}]}}]},
        {"choices": [{"message": {"tool_calls": [{"function": {"name": "x", "arguments": 3}}]}}]},
    ],
)
def test_malformed_completions(body: object) -> None:
    with pytest.raises(MalformedReply):
        parse_completion(body)


def _assemble(reply: dict[str, object]) -> ModelReply:
    assembler = StreamAssembler()
    for event in stream_events(reply, "m"):
        data = event.decode().removeprefix("data: ").strip()
        if data != "[DONE]":
            assembler.feed(json.loads(data))
    return assembler.reply()


def test_stream_assembly_joins_fragments_and_reads_final_usage() -> None:
    arguments = json.dumps({"text": "a fairly long argument", "n": [1, 2, 3]})
    reply = _assemble(
        {
            "content": "thinking out loud",
            "chunk": 3,
            "usage": {"prompt_tokens": 11, "completion_tokens": 9},
            "tool_calls": [
                {"name": "s__one", "arguments": arguments, "id": "c1"},
                {"name": "s__two", "arguments": "{}", "id": "c2"},
            ],
        }
    )
    assert reply.content == "thinking out loud"
    assert reply.tool_calls == (ToolCall("c1", "s__one", arguments), ToolCall("c2", "s__two", "{}"))
    assert reply.usage == Usage(11, 9)
    assert reply.finish_reason == "tool_calls"
    assert _assemble({"content": "", "tool_calls": [{"name": "x__y", "arguments": {}}]}).content is None


def test_stream_tolerates_repeated_names_and_missing_indexes() -> None:
    assembler = StreamAssembler()
    for piece in ('{"a"', ": 1}"):
        assembler.feed(
            {
                "choices": [
                    {"delta": {"tool_calls": [{"id": "c", "function": {"name": "s__t", "arguments": piece}}]}}
                ]
            }
        )
    assert assembler.reply().tool_calls == (ToolCall("c", "s__t", '{"a": 1}'),)


def test_refusal_is_the_content() -> None:
    body = {
        "choices": [
            {"message": {"content": None, "refusal": "I can't help with that."}, "finish_reason": "stop"}
        ]
    }
    assert parse_completion(body).content == "I can't help with that."


def test_stream_without_chunks_or_names_is_malformed() -> None:
    with pytest.raises(MalformedReply):
        StreamAssembler().reply()
    assembler = StreamAssembler()
    assembler.feed(
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}
    )
    with pytest.raises(MalformedReply):
        assembler.reply()


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("https://gw.example/v1", "https://gw.example/v1/chat/completions"),
        ("https://gw.example/v1/", "https://gw.example/v1/chat/completions"),
        ("https://gw.example/v1/chat/completions", "https://gw.example/v1/chat/completions"),
        ("https://gw.example", "https://gw.example/v1/chat/completions"),
        ("https://gw.example/", "https://gw.example/v1/chat/completions"),
        (
            "http://127.0.0.1:8080/openai?api-version=1",
            "http://127.0.0.1:8080/openai/chat/completions?api-version=1",
        ),
        ("http://localhost:1/x", "http://localhost:1/x/chat/completions"),
        ("http://[::1]:9/v1", "http://[::1]:9/v1/chat/completions"),
        ("http://127.3.4.5/v1", "http://127.3.4.5/v1/chat/completions"),
    ],
)
def test_completions_url(endpoint: str, url: str) -> None:
    assert completions_url(endpoint) == url


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://gw.example/v1",
        "http://10.0.0.1/v1",
        "ftp://127.0.0.1/",
        "https://user:pw@gw.example/v1",
        "gw/v1",
        "https:///v1",
    ],
)
def test_endpoint_rules(endpoint: str) -> None:
    with pytest.raises(ConfigError) as info:
        completions_url(endpoint)
    assert "pw" not in str(info.value)


def test_parse_endpoints() -> None:
    assert parse_endpoints("test") == ["test"]
    assert parse_endpoints("https://a.example, http://127.0.0.1:1") == [
        "https://a.example/v1/chat/completions",
        "http://127.0.0.1:1/v1/chat/completions",
    ]
    assert (
        parse_endpoints(["https://a.example/v1,https://b.example/v1"])[1]
        == "https://b.example/v1/chat/completions"
    )
    with pytest.raises(ConfigError):
        parse_endpoints("test,https://a.example")
    with pytest.raises(ConfigError):
        parse_endpoints(" , ")


def test_display_strips_query() -> None:
    assert (
        display("https://gw.example:8443/v1/chat/completions?key=abc")
        == "https://gw.example:8443/v1/chat/completions"
    )


def test_retry_after() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    assert parse_retry_after("Sun, 29 Nov 2026 12:00:10 GMT", now=1795953600.0) == pytest.approx(10.0)


_calls = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.from_regex(r"[a-z]{1,8}__[a-z_.]{1,12}", fullmatch=True),
            "arguments": st.dictionaries(st.text(max_size=5), st.text(max_size=30), max_size=4),
        }
    ),
    max_size=3,
)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=120), _calls, st.integers(min_value=1, max_value=40))
def test_streamed_and_plain_replies_agree(content: str, calls: list[dict[str, object]], chunk: int) -> None:
    reply = {"content": content, "tool_calls": calls, "chunk": chunk}
    plain = parse_completion(json.loads(json.dumps(completion_body(reply, "m"))))
    streamed = _assemble(reply)
    assert streamed.tool_calls == plain.tool_calls
    assert streamed.content == (plain.content or None)
    assert streamed.usage == plain.usage and streamed.finish_reason == plain.finish_reason
