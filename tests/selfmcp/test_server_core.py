"""The sans-io server core on its own: routing per request, session bookkeeping, replay, header rules."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentd.mcp.jsonrpc import MAX_ERROR_MESSAGE, ErrorResponse, Request, dumps
from agentd.mcp.server_session import (
    MAX_BATCH,
    HttpRequest,
    LegacyPost,
    LegacyStream,
    ModernPost,
    Reply,
    ServerCore,
    ServerIdentity,
    decode_header_value,
    updated_notification,
)

IDENTITY = ServerIdentity("agentd", "9.9", {"tools": {}, "resources": {"subscribe": True}})
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _init(core: ServerCore, now: float = 0.0) -> LegacyPost:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}})
    routed = core.route(HttpRequest("POST", ACCEPT, body.encode()), now)
    assert isinstance(routed, LegacyPost)
    return routed


def test_initialize_creates_a_session_and_sets_the_header() -> None:
    core = ServerCore(IDENTITY, new_session_id=lambda: "s1")
    post = _init(core)
    reply = core.legacy_reply(post, {})
    assert ("mcp-session-id", "s1") in reply.headers
    assert json.loads(reply.body)["result"]["serverInfo"] == {"name": "agentd", "version": "9.9"}


def test_idle_sessions_make_room_only_after_the_idle_time() -> None:
    ids = iter(range(100))
    core = ServerCore(IDENTITY, max_sessions=2, session_idle=60, evict_after=60,
                      new_session_id=lambda: str(next(ids)))
    _init(core, 0)
    _init(core, 1)
    full = core.route(HttpRequest("POST", ACCEPT, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                                                "params": {"protocolVersion": "x"}}).encode()), 30)
    assert isinstance(full, Reply) and full.http.status == 503
    assert isinstance(_init(core, 60.5), LegacyPost)  # session 0 idled out, session 1 not yet
    assert set(core.sessions) == {"1", "2"}


def test_a_full_table_gives_the_idlest_session_s_place_to_a_new_client() -> None:
    """Abandoned sessions (no DELETE) must not lock new clients out until they expire."""
    assert ServerCore(IDENTITY).session_idle <= 600  # minutes, not an hour
    ids = iter(range(100))
    core = ServerCore(IDENTITY, max_sessions=2, evict_after=30, new_session_id=lambda: str(next(ids)))
    _init(core, 0)
    _init(core, 1)
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "x"}})
    full = core.route(HttpRequest("POST", ACCEPT, init.encode()), 10)
    assert isinstance(full, Reply) and full.http.status == 503  # nobody idle long enough yet
    ping = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"}).encode()
    assert isinstance(core.route(HttpRequest("POST", {**ACCEPT, "mcp-session-id": "0"}, ping), 20), LegacyPost)
    assert isinstance(_init(core, 40), LegacyPost)  # "1" (idle 39 s) goes, "0" (idle 20 s) stays
    assert set(core.sessions) == {"0", "2"}
    assert core.take_expired() == ["1"]


def test_one_owner_holds_at_most_its_share_and_only_its_own_sessions() -> None:
    """A principal keeping its sessions alive (pings are use) cannot take the whole table; another owner's
    session id is as unknown as a made-up one."""
    ids = iter(range(100))
    core = ServerCore(IDENTITY, max_sessions=8, evict_after=30, new_session_id=lambda: str(next(ids)))
    assert core.max_per_owner == 2
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "x"}}).encode()
    ping = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"}).encode()

    def initialize(owner: str, now: float) -> LegacyPost | Reply:
        routed = core.route(HttpRequest("POST", ACCEPT, init, owner), now)
        assert isinstance(routed, LegacyPost | Reply)
        return routed

    assert all(isinstance(initialize("mallory", 0), LegacyPost) for _ in range(2))
    capped = initialize("mallory", 1)
    assert isinstance(capped, Reply) and capped.http.status == 503
    assert b"for this client (2)" in capped.http.body
    for now in (20, 40):  # kept alive: never idle long enough to be evicted; alice still gets her share
        for sid in ("0", "1"):
            assert isinstance(core.route(HttpRequest("POST", {**ACCEPT, "mcp-session-id": sid}, ping, "mallory"),
                                         now), LegacyPost)
        assert isinstance(initialize("alice", now), LegacyPost)
    assert isinstance(initialize("", 61), LegacyPost)  # the listener's single principal is not counted
    stolen = core.route(HttpRequest("POST", {**ACCEPT, "mcp-session-id": "0"}, ping, "alice"), 62)
    made_up = core.route(HttpRequest("POST", {**ACCEPT, "mcp-session-id": "nope"}, ping, "alice"), 62)
    assert isinstance(stolen, Reply) and isinstance(made_up, Reply)
    assert stolen.http == made_up.http and stolen.http.status == 404
    gone = core.route(HttpRequest("DELETE", {**ACCEPT, "mcp-session-id": "0"}, b"", "alice"), 62)
    assert isinstance(gone, Reply) and gone.http.status == 404 and "0" in core.sessions
    # at its cap, an owner's own idle session makes room for its new one (a client that forgot DELETE)
    assert isinstance(initialize("mallory", 100), LegacyPost)
    assert core.owned("mallory") == 2


def test_batches_are_capped_with_a_json_rpc_error() -> None:
    core = ServerCore(IDENTITY, new_session_id=lambda: "s")
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-03-26"}})
    assert isinstance(core.route(HttpRequest("POST", ACCEPT, body.encode()), 0), LegacyPost)
    headers = {**ACCEPT, "mcp-session-id": "s", "mcp-protocol-version": "2025-03-26"}

    def batch(n: int) -> bytes:
        return json.dumps([{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(n)]).encode()

    ok = core.route(HttpRequest("POST", headers, batch(MAX_BATCH)), 1)
    assert isinstance(ok, LegacyPost) and len(ok.slots) == MAX_BATCH
    refused = core.route(HttpRequest("POST", headers, batch(60_000)), 2)
    assert isinstance(refused, Reply) and refused.http.status == 400
    error = json.loads(refused.http.body)["error"]
    assert error["code"] == -32600 and str(MAX_BATCH) in error["message"]


def test_error_messages_do_not_echo_a_large_value() -> None:
    huge = "\u0001" * 5_000_000  # escapes to six bytes each
    body = dumps(ErrorResponse(1, -32601, f"Method not found: {huge}"))
    assert len(body) < 6 * MAX_ERROR_MESSAGE + 200


def test_replay_after_last_event_id_and_undelivered_on_fresh_get() -> None:
    core = ServerCore(IDENTITY, new_session_id=lambda: "s")
    session = _init(core).session
    first, _ = core.session_event(session, updated_notification("agent://subagent/served.1"))
    second, _ = core.session_event(session, updated_notification("agent://subagent/served.2"))
    get = {"accept": "text/event-stream", "mcp-session-id": "s"}
    stream = core.route(HttpRequest("GET", get), 1)
    assert isinstance(stream, LegacyStream)
    assert [seq for seq, _ in stream.replay] == [first, second]
    core.delivered(session, second)
    core.stream_closed(session, 2)
    again = core.route(HttpRequest("GET", {**get, "last-event-id": str(first)}), 3)
    assert isinstance(again, LegacyStream)
    assert [seq for seq, _ in again.replay] == [second]
    core.stream_closed(session, 4)
    fresh = core.route(HttpRequest("GET", get), 5)
    assert isinstance(fresh, LegacyStream) and fresh.replay == ()


def test_modern_routing_is_by_header_only() -> None:
    core = ServerCore(IDENTITY)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    body = json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {"_meta": meta}}).encode()
    legacy = core.route(HttpRequest("POST", ACCEPT, body), 0)
    assert isinstance(legacy, Reply) and legacy.http.status == 400  # no session: the legacy path
    modern = core.route(HttpRequest("POST", {**ACCEPT, "mcp-protocol-version": "2026-07-28",
                                             "mcp-method": "tools/list"}, body), 0)
    assert isinstance(modern, ModernPost) and modern.request == Request(4, "tools/list", {"_meta": meta})
    reply = core.modern_reply(modern, core_response(4))
    result = json.loads(reply.body)["result"]
    assert result["resultType"] == "complete" and result["ttlMs"] == 0 and result["cacheScope"] == "private"


def core_response(id: int):
    from agentd.mcp.jsonrpc import Response

    return Response(id, {"tools": []})


@given(st.text(min_size=0, max_size=40))
def test_mcp_name_base64_round_trip(name: str) -> None:
    import base64

    assert decode_header_value("=?base64?" + base64.b64encode(name.encode()).decode() + "?=") == name


@given(st.binary(max_size=200))
def test_garbage_bodies_never_crash_the_router(body: bytes) -> None:
    core = ServerCore(IDENTITY)
    for headers in (ACCEPT, {**ACCEPT, "mcp-protocol-version": "2026-07-28", "mcp-method": "x"}):
        routed = core.route(HttpRequest("POST", headers, body), 0)
        assert isinstance(routed, Reply | LegacyPost | ModernPost)
