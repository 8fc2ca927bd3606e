"""The ordering behind whole-run cancellation, on a scripted peer and virtual time: when the pool and an
in-flight ``tools/call`` are cancelled together, ``notifications/cancelled`` goes out before the DELETE."""

from __future__ import annotations

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.errors import McpTransportError
from tests.client.fakeserver import Req, Resp, mcp_answer, serve_fake
from tests.client.helpers import Events, server


async def _hang_calls(req: Req, resp: Resp) -> None:
    if req.rpc_method == "tools/call":
        await trio.sleep_forever()
    await mcp_answer(req, resp)


def _order(requests: list[Req]) -> list[str]:
    return [r.rpc_method or r.method for r in requests if r.rpc_method in ("tools/call", "notifications/cancelled")
            or r.method == "DELETE"]


@pytest.mark.parametrize("caller", ["inside", "outside"])
async def test_cancelling_pool_and_call_together_sends_cancelled_before_delete(
    autojump_clock: trio.abc.Clock, caller: str
) -> None:
    """``inside``: the call runs in a task under the pool block (a run's tool call); ``outside``: in a task of
    the enclosing scope (a drain or a parent's cancel reaching both at once)."""
    events = Events()
    async with trio.open_nursery() as peers:
        fake = await peers.start(serve_fake, _hang_calls)
        with trio.CancelScope() as run:
            async with trio.open_nursery() as outer, open_mcp_pool([server(fake.url)], log=events.log) as pool:
                calling = outer if caller == "outside" else None
                async with trio.open_nursery() as inner:
                    (calling or inner).start_soon(pool.call_tool, "s", "slow", {})
                    while "tools/call" not in fake.methods():
                        await trio.sleep(0.01)
                    run.cancel()
        peers.cancel_scope.cancel()
    assert _order(fake.requests) == ["tools/call", "notifications/cancelled", "DELETE"]
    call = next(r for r in fake.requests if r.rpc_method == "tools/call")
    cancelled = next(r for r in fake.requests if r.rpc_method == "notifications/cancelled")
    assert cancelled.json["params"] == {"requestId": call.json["id"], "reason": "the request was cancelled"}
    assert [e["event"] for e in events.lines if e["event"] in ("mcp.cancelled", "mcp.closed")] == [
        "mcp.cancelled", "mcp.closed"]


async def test_a_request_after_close_began_is_refused_without_sending(autojump_clock: trio.abc.Clock) -> None:
    async with trio.open_nursery() as peers:
        fake = await peers.start(serve_fake, _hang_calls)
        async with open_mcp_pool([server(fake.url)], log=Events().log) as pool:
            conn = pool.connections["s"]
        assert not conn.connected
        with pytest.raises(McpTransportError):
            await conn.call_tool("t", {}, run_id="r", idempotency_key="r/k/1.0")
        peers.cancel_scope.cancel()
    assert "tools/call" not in fake.methods()
