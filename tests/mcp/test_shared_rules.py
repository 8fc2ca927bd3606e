"""The rules both MCP roles share: one definition, and the client's and the server's reading of it agree."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentd.backoff import exponential
from agentd.mcp import meta
from agentd.mcp.client_session import ClientSession, is_modern_refusal
from agentd.mcp.jsonrpc import ErrorResponse, Request, dumps, parse_body
from agentd.mcp.server_session import HttpRequest, ModernPost, Reply, ServerCore, ServerIdentity
from agentd.mcp.sse import SseDecoder
from agentd.mcp.streamable_http import (
    MCP_HEADERS,
    accepts,
    decode_header_value,
    named_value,
    priming_event,
    request_headers,
    sse_message,
)
from agentd.mcp.types import Implementation
from agentd.mcp.versions import LATEST_MODERN, LEGACY_VERSIONS, SUPPORTED_VERSIONS, Era, request_era

IDENTITY = ServerIdentity("agentd", "9.9", {"tools": {}, "resources": {"subscribe": True}})


def _modern_client() -> ClientSession:
    session = ClientSession(Implementation("agentd", "1.0"))
    session.start_discover()
    session.adopt_modern({"supportedVersions": [LATEST_MODERN], "capabilities": {"tools": {}}})
    return session


def _to_server(request: Request, headers: dict[str, str]) -> HttpRequest:
    return HttpRequest("POST", {k.lower(): v for k, v in headers.items()}, dumps(request))


@given(st.sampled_from(["tools/call", "resources/read", "prompts/get", "tools/list"]), st.text(max_size=30))
def test_what_the_client_sends_the_server_accepts(method: str, name: str) -> None:
    """Envelope, Mcp-Method and Mcp-Name (any text, base64 where needed) built by the client pass the server."""
    client = _modern_client()
    key = "uri" if method == "resources/read" else "name"
    params = {key: name} if method != "tools/list" else {}
    request = client.request(method, params)
    headers = request_headers(era=Era.MODERN, protocol_version=client.protocol_version, session_id=None,
                              method=method, params=request.params)
    routed = ServerCore(IDENTITY).route(_to_server(request, headers), 0.0)
    assert isinstance(routed, ModernPost), routed
    assert routed.request == request


def test_a_tampered_name_header_is_a_mismatch() -> None:
    client = _modern_client()
    request = client.request("tools/call", {"name": "echo"})
    headers = request_headers(era=Era.MODERN, protocol_version=client.protocol_version, session_id=None,
                              method="tools/call", params=request.params)
    headers["Mcp-Name"] = "=?base64?not base64!?="
    routed = ServerCore(IDENTITY).route(_to_server(request, headers), 0.0)
    assert isinstance(routed, Reply) and routed.http.status == 400 and b"-32020" in routed.http.body


def test_the_servers_version_refusal_reads_as_modern_to_the_client() -> None:
    client = _modern_client()
    request = client.request("tools/list", {})
    headers = request_headers(era=Era.MODERN, protocol_version="2099-01-01", session_id=None,
                              method="tools/list", params=request.params)
    assert request.params is not None
    request.params["_meta"][meta.PROTOCOL_VERSION] = "2099-01-01"
    routed = ServerCore(IDENTITY).route(_to_server(request, headers), 0.0)
    assert isinstance(routed, Reply)
    error = parse_body(routed.http.body)
    assert isinstance(error, ErrorResponse) and error.data["supported"] == list(SUPPORTED_VERSIONS)
    assert is_modern_refusal(error)


def test_envelope_round_trip_and_malformed_envelopes() -> None:
    params = meta.with_envelope({"_meta": {"x": 1}}, LATEST_MODERN, {"name": "a", "version": "1"})
    assert meta.envelope_version(params) == LATEST_MODERN and params["_meta"]["x"] == 1
    assert meta.envelope_version({}) is None
    assert meta.envelope_version({"_meta": {meta.PROTOCOL_VERSION: LATEST_MODERN}}) is None
    assert meta.envelope_version({"_meta": {meta.PROTOCOL_VERSION: 7, meta.CLIENT_CAPABILITIES: {}}}) is None
    assert meta.subscription_of({"_meta": meta.subscription_meta("L1")}) == "L1"
    assert meta.subscription_of({"_meta": "nope"}) is None


def test_era_routing_and_header_rules() -> None:
    assert request_era(None) is Era.LEGACY
    assert all(request_era(v) is Era.LEGACY for v in LEGACY_VERSIONS)
    assert request_era(LATEST_MODERN) is Era.MODERN and request_era("2099-01-01") is Era.MODERN
    assert accepts(None, "text/event-stream") and accepts("", "application/json")
    assert accepts("application/*;q=0.5", "application/json") and not accepts("text/html", "application/json")
    assert named_value("resources/read", {"uri": "a://b"}) == "a://b"
    assert named_value("tools/call", {"name": 5}) is None and named_value("tools/list", {"name": "x"}) is None
    assert decode_header_value("=?base64?%%%?=") == "=?base64?%%%?="
    assert {h.lower() for h in MCP_HEADERS} >= {"mcp-session-id", "mcp-protocol-version", "mcp-name"}


def test_server_framing_decodes_on_the_client_side() -> None:
    decoder = SseDecoder()
    events = decoder.feed(priming_event("7", 2000) + sse_message(Request(1, "ping"), id="8"))
    assert [e.data for e in events] == ["", '{"jsonrpc":"2.0","id":1,"method":"ping"}']
    assert decoder.last_event_id == "8" and decoder.retry_ms == 2000


def test_exponential_backoff() -> None:
    assert [exponential(n, 0.5, 30.0) for n in range(0, 9)] == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert exponential(10**6, 0.5, 30.0) == 30.0


def test_x_mcp_header_token_with_a_trailing_newline_is_invalid() -> None:
    """Found by the header_rules fuzz target: ``^...$`` let ``"Foo\\n"`` through, and the client would have
    sent a header named ``Mcp-Param-Foo\\n``."""
    from agentd.mcp.streamable_http import invalid_header_annotation

    schema = {"type": "object", "properties": {"a": {"type": "string", "x-mcp-header": "Foo\n"}}}
    assert invalid_header_annotation(schema) == "property 'a': x-mcp-header is not an HTTP token"


def test_a_base64_wrapper_with_non_ascii_inside_stays_as_it_is() -> None:
    """Found by atheris on the header_rules target: a header read as latin-1 may hold ``=?base64?\\xff?=``,
    and ``b64decode`` raised ValueError on the non-ASCII text instead of the wrapper staying as it is."""
    from agentd.mcp.streamable_http import decode_header_value

    assert decode_header_value("=?base64?!\xff\xff?=") == "=?base64?!\xff\xff?="
