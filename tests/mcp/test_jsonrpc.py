"""JSON-RPC envelope parsing: strict envelope, lenient contents, the right error codes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentd.mcp import jsonrpc
from agentd.mcp.jsonrpc import ErrorResponse, InvalidMessage, Notification, Request, Response


def test_kinds() -> None:
    assert jsonrpc.parse_body(b'{"jsonrpc":"2.0","id":1,"method":"ping"}') == Request(1, "ping")
    assert jsonrpc.parse_body(b'{"jsonrpc":"2.0","method":"n","params":{"x":1}}') == Notification("n", {"x": 1})
    assert jsonrpc.parse_body(b'{"jsonrpc":"2.0","id":"a","result":{"k":[1]}}') == Response("a", {"k": [1]})
    assert jsonrpc.parse_body(
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad","data":{"z":1}}}'
    ) == ErrorResponse(None, -32600, "bad", {"z": 1})


def test_unknown_fields_inside_are_kept() -> None:
    message = jsonrpc.parse_body(b'{"jsonrpc":"2.0","id":1,"result":{"tools":[],"futureField":{"a":1}}}')
    assert isinstance(message, Response)
    assert message.result["futureField"] == {"a": 1}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", jsonrpc.PARSE_ERROR),
        (b"\xff\xfe", jsonrpc.PARSE_ERROR),
        (b"[]", jsonrpc.INVALID_REQUEST),
        (b"42", jsonrpc.INVALID_REQUEST),
        (b'{"id":1,"method":"x"}', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":null,"method":"x"}', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":true,"method":"x"}', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"method":""}', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}', jsonrpc.INVALID_PARAMS),
        (b'{"jsonrpc":"2.0","id":1,"result":[]}', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"error":{"code":"x"}}', jsonrpc.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1}', jsonrpc.INVALID_REQUEST),
    ],
)
def test_invalid_messages_carry_the_code_to_answer_with(body: bytes, code: int) -> None:
    with pytest.raises(InvalidMessage) as info:
        jsonrpc.parse_body(body)
    assert info.value.code == code


def test_invalid_params_keeps_the_request_id() -> None:
    with pytest.raises(InvalidMessage) as info:
        jsonrpc.parse_body(b'{"jsonrpc":"2.0","id":9,"method":"x","params":"no"}')
    assert jsonrpc.error_for(info.value) == ErrorResponse(9, jsonrpc.INVALID_PARAMS, '"params" must be an object')


def test_batches_parse_as_lists() -> None:
    body = b'[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"}]'
    assert jsonrpc.parse_body(body) == [Request(1, "a"), Notification("b")]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
ids = st.integers() | st.text()
messages = st.one_of(
    st.builds(Request, ids, st.text(min_size=1), st.none() | st.dictionaries(st.text(), json_values)),
    st.builds(Notification, st.text(min_size=1), st.none() | st.dictionaries(st.text(), json_values)),
    st.builds(Response, ids, st.dictionaries(st.text(), json_values)),
    st.builds(ErrorResponse, st.none() | ids, st.integers(), st.text(), json_values),
)


@given(messages)
def test_round_trip(message: jsonrpc.Message) -> None:
    assert jsonrpc.parse_body(jsonrpc.dumps(message)) == message


@given(st.binary(max_size=200))
def test_garbage_never_escapes_as_another_exception(data: bytes) -> None:
    try:
        jsonrpc.parse_body(data)
    except InvalidMessage:
        pass


@given(json_values)
def test_any_json_value_either_parses_or_is_invalid(value: object) -> None:
    try:
        jsonrpc.parse_body(json.dumps(value))
    except InvalidMessage:
        pass
