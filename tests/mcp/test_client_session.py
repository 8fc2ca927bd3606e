"""The sans-io client session, wire types and Streamable HTTP rules, tested synchronously (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentd.mcp import jsonrpc, types
from agentd.mcp.client_session import (
    CapabilityMissing,
    ClientSession,
    ErrorReceived,
    HandshakeError,
    NotificationReceived,
    ResponseReceived,
    ResultTypeError,
    ServerRequestAnswered,
    SessionError,
    State,
    Unexpected,
    is_modern_refusal,
    result_type,
)
from agentd.mcp.jsonrpc import ErrorResponse, Notification, Request, Response
from agentd.mcp.streamable_http import (
    Body,
    classify,
    decode_header_value,
    encode_header_value,
    request_headers,
    valid_session_id,
)
from agentd.mcp.versions import Era

INFO = types.Implementation(name="agentd", version="9.9.9")


def ready(capabilities: dict[str, Any] | None = None, version: str = "2025-11-25") -> ClientSession:
    session = ClientSession(INFO)
    session.start_initialize()
    session.complete_initialize({"protocolVersion": version, "capabilities": capabilities or {},
                                 "serverInfo": {"name": "srv", "version": "1"}})
    return session


def modern(capabilities: dict[str, Any] | None = None) -> ClientSession:
    session = ClientSession(INFO)
    session.start_initialize()
    assert session.modern_refusal(ErrorResponse(1, -32022, "no", {"supported": ["2026-07-28"]}))
    session.start_discover()
    session.adopt_modern({"supportedVersions": ["2026-07-28"], "capabilities": capabilities or {}})
    return session


def test_initialize_request_is_exactly_the_specified_one() -> None:
    session = ClientSession(INFO)
    request = session.start_initialize()
    assert jsonrpc.to_dict(request) == {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "agentd", "version": "9.9.9"}},
    }
    assert session.state is State.INITIALIZING
    assert jsonrpc.to_dict(session.initialized_notification()) == {
        "jsonrpc": "2.0", "method": "notifications/initialized"}


@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"])
def test_accepted_versions_freeze_capabilities(version: str) -> None:
    session = ready({"resources": {"subscribe": True}}, version)
    assert (session.state, session.era, session.protocol_version) == (State.READY, Era.LEGACY, version)
    assert session.can_subscribe() and not session.tools_list_changed()


@pytest.mark.parametrize("version", ["2026-07-28", "2023-01-01", ""])
def test_other_versions_are_a_handshake_error(version: str) -> None:
    session = ClientSession(INFO)
    session.start_initialize()
    with pytest.raises(HandshakeError, match="agentd does not speak"):
        session.complete_initialize({"protocolVersion": version, "capabilities": {}})


def test_malformed_initialize_result_is_a_handshake_error() -> None:
    session = ClientSession(INFO)
    session.start_initialize()
    with pytest.raises(HandshakeError, match="malformed"):
        session.complete_initialize({"capabilities": {}})


def test_requests_before_ready_or_twice_initialize_are_refused() -> None:
    session = ClientSession(INFO)
    with pytest.raises(SessionError):
        session.request("tools/list")
    session.start_initialize()
    with pytest.raises(SessionError):
        session.start_initialize()


def test_ids_are_unique_and_pending_is_tracked() -> None:
    session = ready()
    a = session.request("tools/list")
    b = session.request("tools/call", {"name": "x"})
    assert a.id != b.id and session.pending == {a.id: "tools/list", b.id: "tools/call"}
    event = session.receive(Response(a.id, {"tools": []}))
    assert event == ResponseReceived(a.id, "tools/list", {"tools": []})
    err = session.receive(ErrorResponse(b.id, -32602, "bad"))
    assert isinstance(err, ErrorReceived) and err.method == "tools/call"
    assert session.pending == {}
    # A late or duplicate answer is unexpected, not a crash.
    assert isinstance(session.receive(Response(a.id, {})), Unexpected)
    assert isinstance(session.receive(ErrorResponse(None, -32700, "parse")), Unexpected)


def test_server_requests_are_answered() -> None:
    session = ready()
    answers = {m: session.receive(Request(f"q-{m}", m)) for m in
               ("ping", "roots/list", "sampling/createMessage", "elicitation/create", "tasks/list")}
    assert all(isinstance(a, ServerRequestAnswered) for a in answers.values())
    replies = {m: a.reply for m, a in answers.items() if isinstance(a, ServerRequestAnswered)}
    assert replies["ping"] == Response("q-ping", {})
    assert replies["roots/list"] == Response("q-roots/list", {"roots": []})
    for method in ("sampling/createMessage", "elicitation/create", "tasks/list"):
        reply = replies[method]
        assert isinstance(reply, ErrorResponse) and reply.code == -32601 and reply.id == f"q-{method}"


def test_notifications_are_routed() -> None:
    session = ready()
    event = session.receive(Notification("notifications/resources/updated", {"uri": "a://b"}))
    assert event == NotificationReceived("notifications/resources/updated", {"uri": "a://b"})
    assert session.receive(Notification("notifications/tools/list_changed")) == NotificationReceived(
        "notifications/tools/list_changed", {})


def test_subscribe_needs_the_advertised_capability() -> None:
    with pytest.raises(CapabilityMissing):
        ready({"resources": {}}).request("resources/subscribe", {"uri": "a://b"})
    with pytest.raises(CapabilityMissing):
        ready({"resources": {"subscribe": "yes"}}).request("resources/subscribe", {"uri": "a://b"})
    assert ready({"resources": {"subscribe": True}}).request("resources/subscribe", {"uri": "a://b"}).params == {
        "uri": "a://b"}


def test_cancel_sends_cancelled_on_legacy_but_never_for_initialize() -> None:
    session = ClientSession(INFO)
    init = session.start_initialize()
    assert session.cancel(init.id, "gone") is None
    session = ready()
    call = session.request("tools/call", {"name": "x"})
    note = session.cancel(call.id, "deadline")
    assert note == Notification("notifications/cancelled", {"requestId": call.id, "reason": "deadline"})
    assert session.cancel(call.id, "again") is None  # already forgotten


def test_legacy_wire_refuses_modern_methods() -> None:
    with pytest.raises(SessionError):
        ready().request("subscriptions/listen", {})
    with pytest.raises(SessionError):
        ready().request("server/discover")


@pytest.mark.parametrize(
    ("error", "modern"),
    [
        (ErrorResponse(1, -32022, "x", {"supported": ["2026-07-28"], "requested": "2025-11-25"}), True),
        (ErrorResponse(1, -32022, "x", {"supported": ["2025-06-18"]}), False),
        (ErrorResponse(1, -32022, "x", None), False),
        (ErrorResponse(None, -32020, "header mismatch"), True),
        (ErrorResponse(None, -32602, "missing _meta"), True),
        (ErrorResponse(None, -32600, "Bad Request: Missing session ID"), False),
        (ErrorResponse(1, -32603, "internal"), False),
    ],
)
def test_modern_refusal_detection(error: ErrorResponse, modern: bool) -> None:
    assert is_modern_refusal(error) is modern


def test_modern_session_wraps_every_request_in_the_envelope() -> None:
    session = modern({"resources": {"subscribe": True}, "tools": {"listChanged": True}})
    assert (session.era, session.protocol_version) == (Era.MODERN, "2026-07-28")
    request = session.request("tools/call", {"name": "t", "arguments": {}, "_meta": {"x/run": "r"}})
    assert request.params is not None
    assert request.params["_meta"] == {
        "x/run": "r",
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        # the tasks extension (SEP-2663), declared per request on tools/call and tasks/* only
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "agentd", "version": "9.9.9"},
    }
    listing = session.request("tools/list", {})
    assert listing.params is not None and listing.params["_meta"]["io.modelcontextprotocol/clientCapabilities"] == {}
    for method in ("ping", "resources/subscribe", "initialize"):
        with pytest.raises(SessionError):
            session.request(method, {})
    # Cancellation is closing the stream: nothing to send.
    assert session.cancel(request.id, "deadline") is None


def test_discover_without_a_mutual_version_fails() -> None:
    session = ClientSession(INFO)
    session.start_initialize()
    session.modern_refusal(ErrorResponse(1, -32602, "x"))
    session.start_discover()
    with pytest.raises(HandshakeError, match="none of which"):
        session.adopt_modern({"supportedVersions": ["2099-01-01"], "capabilities": {}})


def test_reset_goes_back_to_new_and_keeps_counting_ids() -> None:
    session = ready()
    last = session.request("tools/list").id
    session.reset()
    assert session.state is State.NEW and session.pending == {} and session.capabilities == {}
    assert session.start_initialize().id != last


@pytest.mark.parametrize(("result", "ok"), [({}, True), ({"resultType": "complete"}, True),
                                             ({"resultType": "input_required"}, False),
                                             ({"resultType": "weird"}, False)])
def test_result_type(result: dict[str, Any], ok: bool) -> None:
    if ok:
        assert result_type(result) == "complete"
    else:
        with pytest.raises(ResultTypeError):
            result_type(result)


# -- wire types ---------------------------------------------------------------------------------------------------


def test_unknown_fields_are_kept_and_round_trip() -> None:
    wire = {"tools": [{"name": "a", "inputSchema": {"type": "object"}, "icons": [1], "_meta": {"k": 1}}],
            "nextCursor": "c2", "ttlMs": 5, "future": True}
    parsed = types.structure(wire, types.ListToolsResult)
    assert parsed.tools[0].extra == {"icons": [1], "_meta": {"k": 1}}
    assert parsed.extra == {"future": True} and parsed.ttl_ms == 5
    assert types.unstructure(parsed) == wire


@pytest.mark.parametrize("bad", [{"tools": [{"name": 3}]}, {"tools": [{"name": "a", "annotations": [1]}]}, {},
                                 {"tools": [{"name": "a"}], "nextCursor": 5}, [1]])
def test_wrong_types_are_a_wire_error(bad: Any) -> None:
    with pytest.raises(types.WireError):
        types.structure(bad, types.ListToolsResult)


def test_call_tool_result_is_strict_about_is_error() -> None:
    with pytest.raises(types.WireError):
        types.structure({"content": [], "isError": "yes"}, types.CallToolResult)
    assert types.structure({"content": []}, types.CallToolResult).is_error is False


@given(st.dictionaries(st.text(min_size=1).filter(lambda k: k not in {"uri", "name", "title", "description",
                                                                       "mimeType", "size"}),
                       st.integers() | st.text(), max_size=5))
def test_resource_extra_fields_survive(extra: dict[str, Any]) -> None:
    wire = {"uri": "a://b", "name": "b", **extra}
    assert types.unstructure(types.structure(wire, types.Resource)) == wire


# -- streamable HTTP rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "ctype", "method", "session", "body"),
    [
        (200, "application/json", "POST", False, Body.JSON),
        (200, "application/json; charset=utf-8", "POST", False, Body.JSON),
        (200, "text/event-stream", "POST", False, Body.SSE),
        (200, "text/html", "POST", False, Body.BAD_CONTENT_TYPE),
        (200, None, "POST", False, Body.BAD_CONTENT_TYPE),
        (202, None, "POST", False, Body.ACCEPTED),
        (404, "text/plain", "POST", True, Body.SESSION_GONE),
        (404, "text/plain", "POST", False, Body.HTTP_ERROR),
        (405, None, "GET", True, Body.NO_STREAM),
        (307, None, "POST", False, Body.REDIRECT),
        (400, "application/json", "POST", False, Body.HTTP_ERROR),
        (200, "application/json", "GET", True, Body.BAD_CONTENT_TYPE),
    ],
)
def test_classify(status: int, ctype: str | None, method: str, session: bool, body: Body) -> None:
    assert classify(status, ctype, method=method, had_session=session) is body


def test_headers_per_era() -> None:
    assert request_headers(era=None, protocol_version=None, session_id=None) == {
        "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    legacy = request_headers(era=Era.LEGACY, protocol_version="2025-06-18", session_id="abc", method="tools/call",
                             params={"name": "x"})
    assert legacy["Mcp-Session-Id"] == "abc" and legacy["MCP-Protocol-Version"] == "2025-06-18"
    assert "Mcp-Method" not in legacy
    get = request_headers(era=Era.LEGACY, protocol_version="2025-11-25", session_id="abc", get=True)
    assert get["Accept"] == "text/event-stream" and "Content-Type" not in get
    mod = request_headers(era=Era.MODERN, protocol_version="2026-07-28", session_id="ignored",
                          method="resources/read", params={"uri": "file:///ü"})
    assert "Mcp-Session-Id" not in mod
    assert mod["Mcp-Method"] == "resources/read" and decode_header_value(mod["Mcp-Name"]) == "file:///ü"
    assert mod["Mcp-Name"].startswith("=?base64?")


@given(st.text())
def test_header_values_round_trip(value: str) -> None:
    encoded = encode_header_value(value)
    assert all(0x20 <= ord(c) <= 0x7E for c in encoded)
    assert decode_header_value(encoded) == value


def test_session_id_grammar() -> None:
    assert valid_session_id("a-B_9.~!")
    assert not valid_session_id("") and not valid_session_id("has space") and not valid_session_id("é")


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=10)


@given(st.fixed_dictionaries({"jsonrpc": st.just("2.0")}, optional={
    "id": st.integers(0, 5) | st.text(max_size=3) | st.none(),
    "method": st.sampled_from(["ping", "roots/list", "notifications/x", "sampling/createMessage", ""]),
    "params": _json, "result": _json, "error": _json}))
def test_receive_never_raises_on_any_parsable_message(obj: dict[str, Any]) -> None:
    session = ready()
    session.request("tools/list")
    try:
        message = jsonrpc.parse_message(obj)
    except jsonrpc.InvalidMessage:
        return
    event = session.receive(message)
    assert isinstance(event, ResponseReceived | ErrorReceived | ServerRequestAnswered | NotificationReceived
                      | Unexpected)


def test_x_mcp_header_rules() -> None:
    from agentd.mcp.streamable_http import invalid_header_annotation, param_headers

    ok = {"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": "Region"},
                                           "n": {"type": "object", "properties": {
                                               "deep": {"type": "integer", "x-mcp-header": "Deep"}}}}}
    assert invalid_header_annotation(ok) is None
    assert param_headers(ok, {"r": "eu", "n": {"deep": 7}}) == {"Mcp-Param-Region": "eu", "Mcp-Param-Deep": "7"}
    assert param_headers(ok, {"n": "not an object"}) == {}
    for bad in (
        {"type": "object", "properties": {"r": {"type": "number", "x-mcp-header": "R"}}},
        {"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": "has space"}}},
        {"type": "object", "items": {"type": "string", "x-mcp-header": "I"}},
        {"x-mcp-header": "Root"},
        {"type": "object", "properties": {"a": {"type": "string", "x-mcp-header": "X"},
                                          "b": {"type": "string", "x-mcp-header": "x"}}},
    ):
        assert invalid_header_annotation(bad) is not None
    assert encode_header_value("=?base64?abc?=").startswith("=?base64?") and encode_header_value(" x").startswith("=?")


KEY = "io.modelcontextprotocol/idempotency-key"


@pytest.mark.parametrize(("tools", "declared"), [
    (None, False), ({}, False), ({"idempotency": {}}, True), ({"idempotency": True}, True),
    ({"idempotency": False}, False), ({"idempotency": "yes"}, False), ({"listChanged": True}, False),
])
def test_the_standard_idempotency_field_is_sent_only_when_declared(tools: Any, declared: bool) -> None:
    from agentd.mcp.meta import tool_call_params

    for session in (ready({"tools": tools} if tools is not None else {}),
                    modern({"tools": tools} if tools is not None else {})):
        assert session.tools_idempotency() is declared
        params = tool_call_params("t", {"a": 1}, run_id="r", key="r/n/1.0",
                                  standard_field=session.tools_idempotency())
        request = session.request("tools/call", params)
        assert request.params is not None
        assert request.params["_meta"]["io.modelcontextprotocol/run-id"] == "r"
        assert request.params["_meta"][KEY] == "r/n/1.0"  # kept beside the modern envelope
        if session.era is Era.MODERN:
            assert request.params["_meta"]["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
        assert request.params.get("idempotencyKey") == ("r/n/1.0" if declared else None)
        assert ("idempotencyKey" in request.params) is declared
