"""The Events extension as agentd serves it (2026-07-28 wire), against a real ``agentd --serve-mcp`` process with
the scripted gateway as its model, driven by raw JSON-RPC over httpx:

- ``server/discover`` declares ``io.modelcontextprotocol/events``; ``events/list`` lists ``subagent.finished``,
  ``budget.exhausted``, ``approval.pending`` and ``approval.decided`` (poll and push delivery; push:
  tests/selfmcp/test_served_events_stream.py); the 2025-11-25 ``initialize`` is unchanged and has no ``events/*``;
- async spawns made over a 2025-11-25 session show up as ``subagent.finished`` to a modern-wire poller;
- with ``--state-dir``, a cursor handed out before a SIGKILL goes on after the restart: every event once, none
  twice, the end of a run resumed after the restart included;
- with OAuth, a principal polls its own handles' events only;
- peer garbage: a cursor that is no cursor, bad arguments are ``-32602``; an unknown event type is the
  extension's ``-32011``; an ``events/*`` request that does not declare the extension is ``-32021``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.integration.agents import agentd_worker
from tests.peers.gateway import scripted_gateway, text
from tests.security.idp import idp
from tests.selfmcp.harness import MODERN, LegacyPeer, decode_reply, modern_headers, rpc
from tests.waiting import until

pytestmark = [pytest.mark.usefixtures("no_leftover_children")]

EXTENSION = "io.modelcontextprotocol/events"
HOLD = "HOLD: wait for the test"
SERVED = {"tools": {}, "resources": {"subscribe": True}}


async def _modern(client: httpx.AsyncClient, url: str, method: str, params: dict[str, Any], *,
                  headers: dict[str, str] | None = None, extension: bool = True) -> dict[str, Any]:
    caps = {"extensions": {EXTENSION: {}}} if extension else {}
    envelope = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": caps}
    r = await client.post(url, headers={**modern_headers(method), **(headers or {})},
                          json=rpc(method, {**params, "_meta": envelope}))
    return decode_reply(r)


async def _poll(client: httpx.AsyncClient, url: str, cursor: str | None, *, headers: dict[str, str] | None = None,
                **params: Any) -> dict[str, Any]:
    answer = await _modern(client, url, "events/poll", {"name": "subagent.finished", "cursor": cursor, **params},
                           headers=headers)
    assert "result" in answer, answer
    result = dict(answer["result"])
    assert result["resultType"] == "complete" and isinstance(result["cursor"], str), result
    return result


async def _poll_until(client: httpx.AsyncClient, url: str, cursor: str, want: int, **kw: Any) -> list[dict[str, Any]]:
    """Poll from ``cursor`` on until ``want`` events came (each poll goes on from the last one's cursor)."""
    seen: list[dict[str, Any]] = []

    async def enough() -> bool:
        nonlocal cursor
        result = await _poll(client, url, cursor, **kw)
        seen.extend(result["events"])
        cursor = result["cursor"]
        return len(seen) >= want

    await until(enough, timeout=60, what=f"{want} events")
    return seen


async def _spawn_async(peer: LegacyPeer, instruction: str) -> str:
    answer = await peer.call("tools/call", {"name": "subagent.spawn",
                                            "arguments": {"instruction": instruction, "async": True}})
    handle = answer["result"]["structuredContent"]["handle"]
    assert isinstance(handle, str) and handle.startswith("served."), answer
    return handle


async def test_legacy_spawns_show_up_to_a_modern_poller_and_cursors_survive_sigkill(tmp_path: Path) -> None:
    release = trio.Event()
    rules = [({"contains": HOLD}, text("released", wait=release))]
    async with scripted_gateway(rules=rules, default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url,
                "--state-dir", str(tmp_path / "state"), "--drain-timeout", "3", "--cancel-grace", "1"]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            with trio.fail_after(60):
                discover = (await _modern(client, url, "server/discover", {}))["result"]
                assert discover["capabilities"]["extensions"][EXTENSION] == {}, discover
                listed = (await _modern(client, url, "events/list", {}))["result"]
                types = {t["name"]: t for t in listed["events"]}
                assert set(types) == {"subagent.finished", "budget.exhausted", "approval.pending",
                                      "approval.decided"}, listed
                assert all(t["delivery"] == ["poll", "push"] and "inputSchema" in t and "payloadSchema" in t
                           for t in types.values())

                peer = LegacyPeer(client, url)
                init = await peer.initialize()
                assert init["capabilities"] == SERVED, init  # the 2025-11-25 served set stays exactly this
                legacy = await peer.call("events/poll", {"name": "subagent.finished"})
                assert legacy["error"]["code"] == -32601, legacy

                start = await _poll(client, url, None)  # a null cursor: from now, nothing yet
                assert start["events"] == [] and start["truncated"] is False and start["nextPollMs"] > 0

                first = await _spawn_async(peer, "say fine")
                [event] = await _poll_until(client, url, start["cursor"], 1)
                assert event["name"] == "subagent.finished" and {"eventId", "timestamp", "cursor"} <= set(event)
                assert event["data"]["handle"] == first and event["data"]["status"] == "completed", event
                after_first = event["cursor"]

                second = await _spawn_async(peer, "say fine")
                [event2] = await _poll_until(client, url, after_first, 1)  # not seen by the "poller" below
                assert event2["data"]["handle"] == second
                held = await _spawn_async(peer, HOLD)  # still running when agentd dies
                await until(lambda: any(HOLD in json.dumps(r.body) for r in gw.requests), timeout=60,
                            what="the held run's model call")
            os.kill(worker.pid, signal.SIGKILL)

        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            with trio.fail_after(60):
                # The poller comes back with the cursor it had before the crash: the second run's end, once.
                again = await _poll(client, url, after_first)
                assert [e["data"]["handle"] for e in again["events"]] == [second], again
                assert again["truncated"] is False
                release.set()  # the held run was resumed by the restarted agentd; its end is an event too
                [late] = await _poll_until(client, url, again["cursor"], 1)
                assert late["data"]["handle"] == held and late["data"]["status"] == "completed", late
                # From the very first cursor: every event exactly once, in order.
                everything = await _poll(client, url, start["cursor"])
                assert [e["data"]["handle"] for e in everything["events"]] == [first, second, held], everything
                assert len({e["eventId"] for e in everything["events"]}) == 3
                one = await _poll(client, url, start["cursor"], arguments={"handle": second})
                assert [e["data"]["handle"] for e in one["events"]] == [second], one
                paged = await _poll(client, url, start["cursor"], maxEvents=2)
                assert paged["hasMore"] is True and len(paged["events"]) == 2, paged
                rest = await _poll(client, url, paged["cursor"], maxEvents=2)
                assert [e["data"]["handle"] for e in rest["events"]] == [held] and rest["hasMore"] is False


async def test_a_principal_polls_its_own_handles_events_only() -> None:
    async with idp() as authority, scripted_gateway(default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-oauth-issuer", authority.issuer,
                "--intelligence", gw.url]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            with trio.fail_after(60):
                auth = {sub: {"authorization": f"Bearer {authority.mint(aud=url, sub=sub)}"} for sub in ("alice", "bob")}
                start = {sub: (await _poll(client, url, None, headers=auth[sub]))["cursor"] for sub in auth}
                alice = LegacyPeer(client, url, headers=auth["alice"])
                await alice.initialize()
                handle = await _spawn_async(alice, "say fine")
                [event] = await _poll_until(client, url, start["alice"], 1, headers=auth["alice"])
                assert event["data"]["handle"] == handle
                theirs = await _poll(client, url, start["bob"], headers=auth["bob"])
                assert theirs["events"] == [] and theirs["truncated"] is False, theirs
                named = await _poll(client, url, start["bob"], headers=auth["bob"], arguments={"handle": handle})
                assert named["events"] == [], named


async def test_peer_garbage_gets_the_right_errors() -> None:
    async with scripted_gateway(default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            with trio.fail_after(60):
                start = (await _poll(client, url, None))["cursor"]
                bad = [
                    {"name": "subagent.finished", "cursor": "not-a-cursor"},
                    {"name": "subagent.finished", "cursor": start[:-1] + "9" * 12},  # past the head: forged
                    {"name": "subagent.finished", "cursor": 7},
                    {"name": "subagent.finished", "arguments": {"owner": "x"}},
                    {"name": "subagent.finished", "arguments": {"handle": 3}},
                    {"name": "subagent.finished", "maxEvents": 0},
                    {"name": "subagent.finished", "maxAgeMs": -1},
                    {"cursor": None},
                ]
                for params in bad:
                    answer = await _modern(client, url, "events/poll", params)
                    assert answer["error"]["code"] == -32602, (params, answer)
                unknown = await _modern(client, url, "events/poll", {"name": "no.such.event", "cursor": None})
                assert unknown["error"]["code"] == -32011 and unknown["error"]["data"] == {"kind": "event"}, unknown
                undeclared = await _modern(client, url, "events/poll", {"name": "subagent.finished"}, extension=False)
                assert undeclared["error"]["code"] == -32021, undeclared
                answer = await _modern(client, url, "events/subscribe", {"name": "subagent.finished"})
                assert answer["error"]["code"] == -32601, answer  # no webhook delivery
                for params in bad:  # a stream is refused the same way, at once, before any stream opens
                    answer = await _modern(client, url, "events/stream", params)
                    assert answer["error"]["code"] == -32602, (params, answer)
                # A cursor of another log (an agentd restarted without a journal): what is kept, truncated.
                other = "v1.0123456789abcdef.5"
                foreign = await _poll(client, url, other)
                assert foreign["truncated"] is True and foreign["cursor"].startswith(start.rsplit(".", 1)[0])
