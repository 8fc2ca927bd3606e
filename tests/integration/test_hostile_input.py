"""Hostile strings and sizes sent to a real serving agentd (``--serve-mcp … --intelligence test``).

A lone UTF-16 surrogate escape anywhere in a request is a -32700 parse error with a JSON body, and the
daemon keeps serving; a body of millions of wrong items is refused at once, without freezing the other
clients. Bodies are written by hand: a JSON encoder would refuse to produce the lone surrogates.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import trio

from tests.integration.agents import Worker, agentd_worker
from tests.selfmcp.harness import LegacyPeer, decode_reply

ARGV = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", "test"]
LONE = "\\ud800"  # as it appears in the JSON text: a backslash escape, not a character


def _url(worker: Worker) -> str:
    return worker.url if worker.url.endswith("/mcp") else worker.url + "/mcp"


async def _raw(peer: LegacyPeer, body: str) -> httpx.Response:
    return await peer.client.post(peer.url, headers=peer.headers(), content=body.encode())


def _call(name: str, arguments: str, id: int | str = 7) -> str:
    return ('{"jsonrpc":"2.0","id":' + json.dumps(id) + ',"method":"tools/call","params":{"name":"' + name
            + '","arguments":' + arguments + "}}")


async def _status_ok(peer: LegacyPeer) -> None:
    reply = await peer.call("tools/call", {"name": "status", "arguments": {}})
    assert reply["result"]["structuredContent"]["pid"] > 0, reply


def _parse_error(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 400, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == -32700, body
    return dict(body)


async def test_lone_surrogates_are_a_parse_error_and_the_daemon_keeps_serving() -> None:
    bodies = [
        _call("subagent.spawn", '{"instruction":"hi @"}'.replace("@", LONE)),
        _call("subagent.spawn", '{"instruction":"hi","output_contract":"x @"}'.replace("@", LONE)),
        _call("subagent.spawn", '{"instruction":"hi","tool_scope":["@"]}'.replace("@", LONE)),
        _call("subagent.spawn", '{"instruction":"hi","@":1}'.replace("@", LONE)),
        '{"jsonrpc":"2.0","id":"a@","method":"ping"}'.replace("@", LONE),
        '{"jsonrpc":"2.0","id":3,"method":"tools/@"}'.replace("@", LONE),
        '{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"agent://@"}}'.replace("@", LONE),
        # Raw surrogate bytes (CESU-8) are not UTF-8 at all.
        '{"jsonrpc":"2.0","id":5,"method":"ping","params":{"x":"\ud800"}}',
    ]
    async with agentd_worker(ARGV) as worker, httpx.AsyncClient(timeout=10) as client:
        peer = LegacyPeer(client, _url(worker))
        with trio.fail_after(30):
            await peer.initialize()
            for body in bodies:
                encoded = body.encode("utf-8", "surrogatepass")
                r = await client.post(peer.url, headers=peer.headers(), content=encoded)
                _parse_error(r)
            # A well-formed surrogate pair is one ordinary character, accepted as such.
            r = await _raw(peer, _call("subagent.spawn", '{"instruction":"smile \\ud83d\\ude00"}'))
            assert r.status_code == 200, r.text
            assert "error" not in decode_reply(r), r.text
            await trio.sleep(0.5)  # real time: the spawned child (a real process, if any) starts and reports
            await _status_ok(peer)
        assert os.waitpid(worker.pid, os.WNOHANG) == (0, 0), "the daemon exited"
    assert worker.returncode == 0, worker.events[-5:]
    assert not [e for e in worker.events if e.get("event") == "non-json"], worker.events


async def test_millions_of_tool_scope_items_are_refused_without_freezing_the_daemon() -> None:
    items = ",".join(["1"] * 2_600_000)  # 5.2 MB, under the 8 MiB body limit
    body = _call("subagent.spawn", '{"instruction":"hi","tool_scope":[' + items + "]}")
    async with agentd_worker(ARGV) as worker, httpx.AsyncClient(timeout=60) as client, \
            httpx.AsyncClient(timeout=60) as other:
        peer = LegacyPeer(client, _url(worker))
        probe = LegacyPeer(other, _url(worker))
        with trio.fail_after(30):
            await peer.initialize()
            await probe.initialize()
        answered: list[dict[str, Any]] = []

        async def hostile() -> None:
            r = await _raw(peer, body)
            answered.append(decode_reply(r))

        with trio.fail_after(10):  # was 40-50 s of a frozen event loop
            async with trio.open_nursery() as nursery:
                nursery.start_soon(hostile)
                await trio.sleep(0.2)  # real time: the real daemon is busy with the hostile request
                await _status_ok(probe)  # answered while the hostile request is being handled
        reply = answered[0]
        text = json.dumps(reply)
        assert len(text) < 10_000, "the refusal quotes the hostile value"
        assert reply["error"]["code"] == -32602, reply
        assert "more than the 256 allowed" in reply["error"]["message"], reply
