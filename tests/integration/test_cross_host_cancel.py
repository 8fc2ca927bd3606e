"""One kill ladder across hosts on the 2025-11-25 wire: an agentd parent that speaks only the legacy era to its
child agentd (``--mcp-era child=legacy``) is cancelled while its ``subagent.spawn`` is in flight; it sends
``notifications/cancelled`` for the call, and a child serving with ``--serve-accept-cancel`` ends that run
``cancelled`` through the kill ladder, with no further model request. Real processes, real sockets, one scripted
gateway for both.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from tests.integration.agents import agentd_worker
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.selfmcp.harness import LegacyPeer
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

CHILD_TASK = "CHILD-TASK: wait for the test"


def _child_requests(requests: list[RecordedRequest]) -> int:
    return sum(1 for r in requests if CHILD_TASK in json.dumps(r.body))


async def test_a_cancelled_legacy_parent_ends_its_childs_run_with_serve_accept_cancel() -> None:
    hold = trio.Event()  # never set: the child's model call waits until its run is cancelled
    rules = [({"contains": CHILD_TASK}, text("never", wait=hold)),
             ({"contains": "PARENT-TASK"}, tool_call("child__subagent_spawn", {"instruction": CHILD_TASK}))]
    async with scripted_gateway(rules=rules, default=text("done")) as gw:
        child_argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-accept-cancel", "--intelligence", gw.url,
                      "--cancel-grace", "1", "--term-grace", "1"]
        async with agentd_worker(child_argv) as child:
            parent_argv = ["--instruction", "PARENT-TASK delegate", "--mcp", f"child={child.url}",
                           "--mcp-era", "child=legacy", "--intelligence", gw.url, "--drain-timeout", "1"]
            with trio.fail_after(90):
                async with agentd_worker(parent_argv, serving=False) as parent:
                    await until(lambda: _child_requests(gw.requests), timeout=90,
                                what="the child's run in its model call")
                    parent.drain()  # the parent is cancelled: its run, and the tool call in flight
                await child.wait_event(lambda e: e.get("event") == "serve.request"
                                       and e.get("method") == "notifications/cancelled")
                async with httpx.AsyncClient(timeout=30) as client:
                    peer = LegacyPeer(client, child.url)
                    await peer.initialize()

                    async def ended() -> dict[str, Any] | None:
                        status = await peer.call("tools/call", {"name": "subagent.status",
                                                                "arguments": {"handle": "served.1"}})
                        view = status["result"]["structuredContent"]
                        return view if view["done"] else None

                    view = await until(ended, timeout=90, what="served.1 ended")
                assert view["status"] == "cancelled", view
    assert _child_requests(gw.requests) == 1  # no further model request after the cancel
