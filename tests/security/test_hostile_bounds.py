"""Hostile-input bounds against a real daemon, each with a well-behaved client measured alongside.

Every attack here once froze or killed a daemon or grew it without bound: a tool schema whose check ran for
tens of seconds on the event loop (``uniqueItems`` over thousands of objects, a ``patternProperties`` regex
against a long property name, a subschema naming another dialect to escape the bounds), refused A2A tasks
kept for ten minutes each, and nesting that raised ``RecursionError`` out of a JSON decoder. While each
runs, :func:`tests.selfmcp.concurrent.kept_serving` calls the daemon's served ``status`` in a loop and
fails the test if any answer took more than two seconds.

Real parts only: ``agentd`` is a subprocess, the MCP server (tests/client/fakeserver.py) and the model
(tests/peers/gateway.py) are peers on loopback, and the control socket is a real Unix socket.
"""

from __future__ import annotations

import datetime
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.client.fakeserver import Req, Resp, mcp_answer, result, serve_fake
from tests.ctl.daemon import ctl
from tests.integration.agents import agentd_worker
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_calls
from tests.security.mutate import mutations
from tests.selfmcp.concurrent import kept_serving

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

#: The good client's longest wait for an answer while an attack runs.
MAX_GAP = 2.0

DRAFT4 = "http://json-schema.org/draft-04/schema#"
HOSTILE_TOOLS: list[dict[str, Any]] = [
    {"name": "uniq", "inputSchema": {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}},
    {"name": "names", "inputSchema": {"type": "object", "patternProperties": {"^a*a*a*a*$": {"type": "string"}}}},
    {"name": "poly", "inputSchema": {"type": "object", "properties": {
        "xs": {"type": "array", "items": {"type": "string", "pattern": "^a*a*a*a*$"}}}}},
    # a subschema naming another dialect once got jsonschema's own (unbounded) draft-04 class
    {"name": "dialect", "inputSchema": {"type": "object", "properties": {
        "xs": {"$schema": DRAFT4, "type": "array", "uniqueItems": True}}}},
]
#: Arguments that cost tens of seconds to minutes to check unbounded (pairwise uniqueItems, n**5 regex).
HOSTILE_CALLS = tool_calls(
    ("bad__uniq", {"xs": [{"k": i, "v": [i, str(i)]} for i in range(30000)]}),
    ("bad__names", {"a" * 3000 + "!": "x"}),
    ("bad__poly", {"xs": ["a" * 25] * 3000}),
    ("bad__dialect", {"xs": [{"k": i, "v": [i, str(i)]} for i in range(30000)]}),
)


def _server(tools: list[dict[str, Any]]) -> Any:
    async def handler(req: Req, resp: Resp) -> None:
        if req.rpc_method == "tools/list":
            await resp.json(result(req, {"tools": tools}))
        elif req.rpc_method == "tools/call":
            await resp.json(result(req, {"content": [{"type": "text", "text": "ok"}]}))
        else:
            await mcp_answer(req, resp)

    return handler


def _calls(requests: list[Req]) -> list[str]:
    return [r.json["params"]["name"] for r in requests if r.method == "POST" and r.rpc_method == "tools/call"]


def _ts(event: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


def _refusals(request: RecordedRequest) -> list[str]:
    return [str(m.get("content")) for m in request.messages if m.get("role") == "tool"]


# -- hostile tool schemas ------------------------------------------------------------------------------------


async def test_hostile_schemas_cost_one_refused_call_each_while_the_daemon_serves() -> None:
    """Four hostile schemas, called over and over by the model while the good client is measured: each call
    is refused as too costly to check (never sent), and the served ``status`` keeps answering."""
    release = trio.Event()
    rounds = 0

    def reply(request: RecordedRequest) -> dict[str, Any]:
        nonlocal rounds
        if release.is_set():
            return text("done")
        rounds += 1
        return HOSTILE_CALLS

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_fake, _server(HOSTILE_TOOLS))
        async with scripted_gateway(default=reply) as gw:
            argv = ["--serve-mcp", "http://127.0.0.1:0", "--instruction", "go", "--intelligence", gw.url,
                    "--mcp", f"bad={server.url}", "--max-steps", "1000"]
            async with agentd_worker(argv, stop_timeout=60) as worker:
                assert worker.url
                async with kept_serving(worker.url, max_gap=MAX_GAP, server_pid=worker.pid) as probe:
                    with trio.fail_after(120):
                        await probe.wait_rounds(probe.rounds + 5)
                        while rounds < 4:  # the attack ran (several model turns) while the probe was measured
                            await probe.wait_rounds(probe.rounds + 1)
                        release.set()
                        end = await worker.wait_event(lambda e: e.get("event") == "run.end")
                assert end["status"] == "completed", end
        nursery.cancel_scope.cancel()
    assert _calls(server.requests) == []  # refused locally, not one sent
    refusals = _refusals(gw.requests[1])
    assert len(refusals) == 4, refusals
    for refusal in refusals:
        assert "would cost too much" in refusal and "server 'bad'" in refusal, refusal
        assert len(refusal) < 1000, refusal  # no argument is echoed back whole


async def test_the_deadline_holds_while_hostile_schemas_are_checked() -> None:
    """A run whose model sends nothing but hostile calls ends at its deadline: checks run off the event loop
    within a budget, so the deadline is not held up by them (an unbounded check once made a 15 s deadline
    end after 44.6 s)."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_fake, _server(HOSTILE_TOOLS))
        async with scripted_gateway(default=HOSTILE_CALLS) as gw:
            argv = ["--serve-mcp", "http://127.0.0.1:0", "--instruction", "go", "--intelligence", gw.url,
                    "--mcp", f"bad={server.url}", "--max-steps", "100000", "--deadline", "4"]
            async with agentd_worker(argv, stop_timeout=60) as worker:
                assert worker.url
                async with kept_serving(worker.url, max_gap=MAX_GAP, server_pid=worker.pid):
                    with trio.fail_after(60):
                        start = await worker.wait_event(lambda e: e.get("event") == "loop.start")
                        end = await worker.wait_event(lambda e: e.get("event") == "run.end")
                assert end["status"] == "deadline", end
                # the daemon's own timestamps: the deadline, plus one check's budget and the run's wrap-up
                took = _ts(end) - _ts(start)
                assert took < 4 + 15, (took, start, end)
        nursery.cancel_scope.cancel()
    assert _calls(server.requests) == []


# -- the served A2A endpoint ---------------------------------------------------------------------------------


def _send_message(text_: str, **message: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": text_}], **message},
        "configuration": {"returnImmediately": True}}}


async def _rpc(client: httpx.AsyncClient, url: str, body: dict[str, Any] | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(url, content=content, headers={"content-type": "application/json"})


async def test_refused_a2a_tasks_are_bounded_and_hostile_bodies_are_answered() -> None:
    """A served run holds the only slot, so every ``SendMessage`` is refused (a rejected task): hundreds of
    them keep only the newest 256 of that caller (no timer per task), the oldest is "Task not found". Then
    mutated bodies (deep nesting, lone surrogates, bytes that are not UTF-8) each get a JSON-RPC answer,
    never a 500, and ``ListTasks`` still works. The good client is measured throughout."""
    hold = trio.Event()

    def reply(request: RecordedRequest) -> dict[str, Any]:
        return text("never", wait=hold)

    async with scripted_gateway(default=reply) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0", "--serve-a2a", "--serve-max-spawns", "1",
                "--intelligence", gw.url, "--drain-timeout", "2", "--cancel-grace", "1"]
        async with agentd_worker(argv, stop_timeout=60) as worker:
            assert worker.url
            a2a = worker.url.removesuffix("/mcp") + "/a2a"
            async with kept_serving(worker.url, max_gap=MAX_GAP, server_pid=worker.pid) as probe, \
                    httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=8)) as bad:
                held = (await _rpc(bad, a2a, _send_message("HOLD"))).json()["result"]["task"]
                refused: list[str] = []

                async def flood(n: int) -> None:
                    for _ in range(n):
                        answer = (await _rpc(bad, a2a, _send_message("more"))).json()["result"]["task"]
                        assert answer["status"]["state"] == "TASK_STATE_REJECTED", answer
                        refused.append(answer["id"])

                with trio.fail_after(180):
                    async with trio.open_nursery() as nursery:
                        for _ in range(6):
                            nursery.start_soon(flood, 100)
                    listed = (await _rpc(bad, a2a, {"jsonrpc": "2.0", "id": 2, "method": "ListTasks",
                                                    "params": {"pageSize": 100}})).json()["result"]
                    assert listed["totalSize"] == 256 + 1, listed["totalSize"]  # the kept refusals + the held one
                    oldest = (await _rpc(bad, a2a, {"jsonrpc": "2.0", "id": 3, "method": "GetTask",
                                                    "params": {"id": refused[0]}})).json()
                    assert oldest["error"]["code"] == -32001, oldest
                    newest = (await _rpc(bad, a2a, {"jsonrpc": "2.0", "id": 4, "method": "GetTask",
                                                    "params": {"id": refused[-1]}})).json()
                    assert newest["result"]["status"]["state"] == "TASK_STATE_REJECTED", newest

                    # hostile bodies: each answered with JSON, never a 500 or an empty body
                    deep = await _rpc(bad, a2a, b"[" * 60000)
                    assert deep.status_code == 200 and deep.json()["error"]["code"] == -32700, deep.text[:200]
                    lone = await _rpc(bad, a2a, json.dumps(_send_message("x", contextId="\ud800")).encode())
                    assert lone.status_code == 200 and lone.json()["error"]["code"] == -32700, lone.text[:200]
                    long_method = await _rpc(bad, a2a, {"jsonrpc": "2.0", "id": 5, "method": "x" * 100000})
                    assert len(long_method.content) < 1000, len(long_method.content)
                    seeds = [json.dumps(_send_message("fuzz")).encode(),
                             json.dumps({"jsonrpc": "2.0", "id": 6, "method": "GetTask", "params": {"id": "zz"}}).encode(),
                             json.dumps({"jsonrpc": "2.0", "id": 7, "method": "ListTasks",
                                         "params": {"contextId": "c", "pageSize": 5}}).encode(),
                             json.dumps({"jsonrpc": "2.0", "id": 8, "method": "CancelTask",
                                         "params": {"id": "zz"}}).encode()]
                    statuses: dict[int, int] = {}
                    for body in mutations(seeds, 300, seed=20261206):
                        answer = await _rpc(bad, a2a, body)
                        statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                        assert answer.status_code < 500 and answer.content, (answer.status_code, body[:200])
                        if answer.status_code == 200:
                            assert isinstance(answer.json(), dict), body[:200]
                    assert statuses.get(200, 0) > 100, statuses
                    after = (await _rpc(bad, a2a, {"jsonrpc": "2.0", "id": 9, "method": "ListTasks",
                                                   "params": {"pageSize": 5}})).json()["result"]
                    assert after["tasks"], after
                assert probe.rounds > 0
            assert held["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
            hold.set()


async def test_unknown_handles_and_methods_are_not_echoed_back_whole() -> None:
    """A megabyte of handle (or of method name) once came back whole in the refusal."""
    from tests.selfmcp.harness import LegacyPeer

    argv = ["--serve-mcp", "http://127.0.0.1:0", "--intelligence", "test"]
    async with agentd_worker(argv, stop_timeout=60) as worker:
        assert worker.url
        async with kept_serving(worker.url, max_gap=MAX_GAP, server_pid=worker.pid) as probe, \
                httpx.AsyncClient(timeout=30) as client:
            peer = LegacyPeer(client, worker.url)
            await peer.initialize()
            with trio.fail_after(60):
                for tool in ("subagent.status", "subagent.cancel"):
                    reply = await peer.post("tools/call", {"name": tool, "arguments": {"handle": "h" * 1_000_000}})
                    assert reply.status_code == 200 and len(reply.content) < 2000, (tool, len(reply.content))
                    assert "unknown handle" in reply.text, reply.text[:300]
                reply = await peer.post("x" * 1_000_000)
                assert len(reply.content) < 2000, len(reply.content)
                reply = await peer.post("resources/read", {"uri": "agent://subagent/" + "h" * 1_000_000})
                assert len(reply.content) < 4000, len(reply.content)
            assert probe.rounds > 0


# -- the control socket --------------------------------------------------------------------------------------


async def _ctl_exchange(path: str, payload: bytes) -> bytes:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(path)
    async with trio.SocketStream(sock) as stream:
        try:
            await stream.send_all(payload)
        except trio.BrokenResourceError:
            pass  # the daemon answered an oversized request and closed before reading it all
        data = b""
        while not data.endswith(b"\n"):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return data


async def test_the_control_socket_answers_hostile_requests_and_keeps_serving(tmp_path: Path) -> None:
    """Sixty thousand ``[`` once raised a RecursionError that ended the daemon. Now that, and hundreds of
    mutated requests, each get one JSON answer; the daemon, its control socket and its served MCP live on."""
    sock = str(tmp_path / "ctl.sock")
    argv = ["--serve-mcp", "http://127.0.0.1:0", "--intelligence", "test", "--ctl-socket", sock]
    async with agentd_worker(argv, stop_timeout=60) as worker:
        assert worker.url
        async with kept_serving(worker.url, max_gap=MAX_GAP, server_pid=worker.pid) as probe:
            with trio.fail_after(120):
                deep = json.loads(await _ctl_exchange(sock, b"[" * 60000 + b"\n"))
                assert deep["error"].startswith("the request is not JSON"), deep
                seeds = [b'{"op": "status"}', b'{"op": "nope", "x": [1, {"y": null}]}',
                         b'{"op": "cancel", "run": "no-such-run"}', b'{"op": "lame-duck", "on": "maybe"}']
                for body in mutations(seeds, 300, seed=6122026):
                    line = await _ctl_exchange(sock, body + b"\n")
                    answer = json.loads(line)
                    assert isinstance(answer, dict), (line[:200], body[:200])
                    assert len(line) < 64 * 1024, (len(line), body[:200])
            assert probe.rounds > 0
        code, doc = await ctl("status", "--socket", sock)
        assert code == 0 and doc.get("run_id"), doc
    assert worker.returncode == 0
