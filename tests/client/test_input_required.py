"""``input_required`` results on the 2026-07-28 wire (SEP-2322): agentd's client follows them up under new ids,
echoing ``requestState`` unchanged, answering input requests as a client without capabilities, and keeping each
round to its own call. Scripted in-process peers on loopback; time (state-only rounds back off) on autojump."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.errors import McpProtocolError
from agentd.mcp.input_required import MAX_ROUNDS
from tests.client.fakeserver import Req, Resp, result, serve_fake
from tests.client.helpers import Events, server
from tests.client.test_modern_scripted import modern_peer

#: Quotes, unicode and JSON inside: echoed byte for byte, never parsed.
STATE = '{"nonce": "ŝtate \\"1\\"", "n": [1, 2]}'


def params_of(req: Req) -> dict[str, Any]:
    params = req.json.get("params") or {}
    assert isinstance(params, dict)
    return params


def scripted(script: Any, declared: tuple[str, ...] = ()) -> Any:
    """A modern peer whose tools/call and resources/read answers come from ``script(req)`` (None: default)."""
    base = modern_peer(declared=declared)

    async def handler(req: Req, resp: Resp) -> None:
        if req.method == "POST" and req.rpc_method in ("tools/call", "resources/read"):
            answer = script(req)
            if answer is not None:
                await resp.json(result(req, answer))
                return
        await base(req, resp)

    return handler


async def test_input_required_is_followed_up_with_the_state_echoed_under_a_new_id() -> None:
    def script(req: Req) -> dict[str, Any] | None:
        params = params_of(req)
        if params.get("name") == "ask" and "inputResponses" not in params:
            return {"resultType": "input_required", "requestState": STATE, "inputRequests": {
                "confirm": {"method": "elicitation/create", "params": {"message": "sure?", "requestedSchema": {}}},
                "where": {"method": "roots/list", "params": {}}}}
        if params.get("name") == "ask":
            return {"resultType": "complete", "content": [{"type": "text", "text": "asked"}]}
        return {"content": [{"type": "text", "text": "plain"}]}  # no resultType: complete

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, scripted(script))
        async with open_mcp_pool([server(fake.url, era="modern")], log=Events().log) as pool:
            got: dict[str, Any] = {}

            async def call(name: str) -> None:
                with trio.fail_after(10):
                    got[name] = await pool.call_tool("s", name, {"x": 1})

            async with trio.open_nursery() as calls:
                calls.start_soon(call, "ask")
                calls.start_soon(call, "plain")
        nursery.cancel_scope.cancel()
    assert got["ask"].content == [{"type": "text", "text": "asked"}] and not got["ask"].is_error
    assert got["plain"].content == [{"type": "text", "text": "plain"}]
    asks = [r for r in fake.requests if r.rpc_method == "tools/call" and params_of(r).get("name") == "ask"]
    assert len(asks) == 2
    first, retry = params_of(asks[0]), params_of(asks[1])
    assert "inputResponses" not in first and "requestState" not in first
    assert retry["requestState"] == STATE
    assert retry["inputResponses"] == {"confirm": {"action": "decline"}, "where": {"roots": []}}
    assert retry["arguments"] == first["arguments"] == {"x": 1}
    assert asks[0].json["id"] != asks[1].json["id"]
    assert asks[1].headers["mcp-name"] == "ask" and asks[1].headers["mcp-method"] == "tools/call"
    plain = [params_of(r) for r in fake.requests if r.rpc_method == "tools/call" and params_of(r).get("name") == "plain"]
    assert len(plain) == 1 and "inputResponses" not in plain[0] and "requestState" not in plain[0]


async def test_state_only_rounds_echo_the_latest_state(autojump_clock: trio.abc.Clock) -> None:
    def script(req: Req) -> dict[str, Any] | None:
        if req.rpc_method != "resources/read":
            return None
        state = params_of(req).get("requestState")
        if state is None:
            return {"resultType": "input_required", "requestState": "s1"}
        if state == "s1":
            return {"resultType": "input_required", "requestState": "s2"}
        return {"resultType": "complete", "contents": [{"uri": "r://slow", "text": f"after {state}"}]}

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, scripted(script))
        async with open_mcp_pool([server(fake.url, era="modern")], log=Events().log) as pool:
            with trio.fail_after(10):
                contents = await pool.read_resource("r://slow", server="s")
        nursery.cancel_scope.cancel()
    assert [c.get("text") for c in contents.contents] == ["after s2"]
    reads = [params_of(r) for r in fake.requests if r.rpc_method == "resources/read"]
    assert [p.get("requestState") for p in reads] == [None, "s1", "s2"]
    assert all("inputResponses" not in p and p["uri"] == "r://slow" for p in reads)


async def test_a_server_that_never_completes_fails_the_call_after_the_round_cap(
    autojump_clock: trio.abc.Clock,
) -> None:
    def script(req: Req) -> dict[str, Any] | None:
        return {"resultType": "input_required", "requestState": "again"} if req.rpc_method == "tools/call" else None

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, scripted(script))
        async with open_mcp_pool([server(fake.url, era="modern")], log=Events().log) as pool:
            with trio.fail_after(60), pytest.raises(McpProtocolError, match=f"after {MAX_ROUNDS} rounds"):
                await pool.call_tool("s", "t", {})
        nursery.cancel_scope.cancel()
    assert fake.methods().count("tools/call") == MAX_ROUNDS + 1


async def test_an_opted_in_server_gets_the_run_s_answers_and_declares_them_per_request() -> None:
    """``capabilities: [elicitation, sampling]``: each request's envelope declares both, and the embedded
    requests are answered by what the run installed (agentd.oversight.approvals.answering) instead of refused."""
    from agentd.oversight.approvals import answering

    def script(req: Req) -> dict[str, Any] | None:
        params = params_of(req)
        if params.get("name") == "ask" and "inputResponses" not in params:
            return {"resultType": "input_required", "requestState": STATE, "inputRequests": {
                "confirm": {"method": "elicitation/create", "params": {"message": "sure?", "requestedSchema": {}}},
                "draft": {"method": "sampling/createMessage", "params": {"messages": []}}}}
        if params.get("name") == "ask":
            return {"resultType": "complete", "content": [{"type": "text", "text": "asked"}]}
        return None

    asked: list[tuple[str, str]] = []

    async def answer(server_name: str, method: str, params: Any) -> dict[str, Any]:
        asked.append((server_name, method))
        if method == "elicitation/create":
            return {"action": "accept", "content": {"ok": True}}
        return {"role": "assistant", "content": {"type": "text", "text": "draft"}, "model": "m"}

    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, scripted(script, ("elicitation", "sampling")))
        opted = server(fake.url, era="modern", capabilities=("elicitation", "sampling"))
        async with open_mcp_pool([opted], log=Events().log) as pool:
            with trio.fail_after(10), answering(answer):
                got = await pool.call_tool("s", "ask", {})
        nursery.cancel_scope.cancel()
    assert got.content == [{"type": "text", "text": "asked"}]
    assert asked == [("s", "elicitation/create"), ("s", "sampling/createMessage")]
    asks = [params_of(r) for r in fake.requests if r.rpc_method == "tools/call"]
    assert asks[1]["inputResponses"] == {"confirm": {"action": "accept", "content": {"ok": True}},
                                         "draft": {"role": "assistant", "content": {"type": "text", "text": "draft"},
                                                   "model": "m"}}
    declared = asks[0]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    assert declared["elicitation"] == {} and declared["sampling"] == {}
