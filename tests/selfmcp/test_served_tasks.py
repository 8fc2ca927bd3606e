"""Served MCP tasks on the 2025-11-25 wire (``--serve-tasks``), against a real ``agentd --serve-mcp`` process
with the scripted gateway as its model, driven by raw JSON-RPC over httpx:

- with the flag, ``initialize`` advertises ``tasks`` for ``tools/call``, ``subagent.spawn`` declares
  ``taskSupport: "optional"``; a task-augmented spawn answers at once with a ``working`` task; ``tasks/get``
  follows it to ``completed``; ``tasks/result`` is exactly the CallToolResult a sync spawn gives;
  ``tasks/list`` lists the tasks (not a plain spawn's handle); ``tasks/cancel`` of a held run walks the
  kill ladder and the task ends ``cancelled``; a task of a tool that cannot be one is -32601;
- after a SIGKILL and a restart on the same ``--state-dir``, a new session's ``tasks/list`` lists the journaled
  tasks (with their ``createdAt``) and ``tasks/get``/``tasks/result`` of the finished tasks still answer;
- with OAuth, a task is its creator's: another principal's ``tasks/get``/``result``/``cancel`` answer exactly as
  for a task never created, and its ``tasks/list`` does not show it;
- the official SDK 1.x experimental tasks client (in ``.peers/mcp1-venv``) parses and drives all of it;
- without the flag, the capability set is exactly ``tools`` and ``resources.subscribe``, no tool declares
  ``execution``, ``params.task`` is ignored (the spawn runs and answers as it always did), and ``tasks/*``
  do not exist.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agentd.selfmcp.tasks import CAPABILITY, RELATED_TASK
from tests.integration.agents import agentd_worker
from tests.peers.gateway import scripted_gateway, text
from tests.peers.launch import ensure_mcp1_venv
from tests.security.idp import idp
from tests.selfmcp.harness import MODERN, LegacyPeer, decode_reply, modern_headers, rpc
from tests.waiting import until

pytestmark = [pytest.mark.usefixtures("no_leftover_children")]

HOLD = "HOLD: wait for the test"
SLOW = "SLOW: answer when the test says"
LATER = "LATER: answer when the test says"
SERVED = {"tools": {}, "resources": {"subscribe": True}}


async def _result(peer: LegacyPeer, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = await peer.call(method, params)
    assert "result" in answer, answer
    return dict(answer["result"])


async def _error(peer: LegacyPeer, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = await peer.call(method, params)
    assert "error" in answer, answer
    return dict(answer["error"])


async def _until(peer: LegacyPeer, task_id: str, status: str) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        task = await _result(peer, "tasks/get", {"taskId": task_id})
        if task["status"] == status:
            return task
        assert task["status"] == "working", task
        return None

    return dict(await until(reached, timeout=60, what=f"task {task_id} {status}"))


def _spawn(instruction: str, **task: Any) -> dict[str, Any]:
    return {"name": "subagent.spawn", "arguments": {"instruction": instruction}, "task": task}


def _without_handle(result: dict[str, Any]) -> dict[str, Any]:
    """A spawn's CallToolResult with its handle blanked: what a task's result and a sync one share."""
    handle = result["structuredContent"]["handle"]
    content = [{**c, "text": c["text"].replace(handle, "H")} for c in result["content"]]
    return {**result, "content": content, "structuredContent": {**result["structuredContent"], "handle": "H"}}


async def test_tasks_are_served_handles_and_answer_after_a_restart(tmp_path: Path) -> None:
    release = trio.Event()
    rules = [({"contains": HOLD}, text("released", wait=release))]
    async with scripted_gateway(rules=rules, default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-tasks", "--intelligence", gw.url,
                "--state-dir", str(tmp_path / "state"), "--drain-timeout", "3", "--cancel-grace", "1"]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            with trio.fail_after(60):
                peer = LegacyPeer(client, worker.url)
                init = await peer.initialize()
                assert init["capabilities"] == {**SERVED, "tasks": CAPABILITY}, init
                tools = {t["name"]: t for t in (await _result(peer, "tools/list", {}))["tools"]}
                assert tools["subagent.spawn"]["execution"] == {"taskSupport": "optional"}
                assert all("execution" not in t for name, t in tools.items() if name != "subagent.spawn")

                sync = await _result(peer, "tools/call", {"name": "subagent.spawn",
                                                          "arguments": {"instruction": "say fine"}})
                assert sync["structuredContent"]["status"] == "completed", sync

                created = (await _result(peer, "tools/call", _spawn("say fine", ttl=60000)))["task"]
                assert created["status"] == "working" and created["taskId"].startswith("served."), created
                assert {"createdAt", "lastUpdatedAt", "ttl", "pollInterval"} <= set(created)
                done = await _until(peer, created["taskId"], "completed")
                assert done["taskId"] == created["taskId"]
                result = await _result(peer, "tasks/result", {"taskId": created["taskId"]})
                assert result.pop("_meta") == {RELATED_TASK: {"taskId": created["taskId"]}}
                assert _without_handle(result) == _without_handle(sync)

                held = (await _result(peer, "tools/call", _spawn(HOLD)))["task"]
                assert (await _result(peer, "tasks/get", {"taskId": held["taskId"]}))["status"] == "working"
                listed = [t["taskId"] for t in (await _result(peer, "tasks/list", {}))["tasks"]]
                assert listed == [created["taskId"], held["taskId"]], listed  # not the sync spawn's handle
                cancelled = await _result(peer, "tasks/cancel", {"taskId": held["taskId"]})
                assert cancelled["status"] == "cancelled" and cancelled["taskId"] == held["taskId"], cancelled
                assert (await _result(peer, "tasks/get", {"taskId": held["taskId"]}))["status"] == "cancelled"
                again = await _error(peer, "tasks/cancel", {"taskId": held["taskId"]})
                assert again["code"] == -32602 and "terminal" in again["message"], again

                unknown = await _error(peer, "tasks/get", {"taskId": "served.9999"})
                assert unknown["code"] == -32602, unknown
                not_a_task = await _error(peer, "tools/call", {"name": "status", "arguments": {}, "task": {}})
                assert not_a_task["code"] == -32601, not_a_task
            os.kill(worker.pid, signal.SIGKILL)
        release.set()

        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            with trio.fail_after(60):
                peer = LegacyPeer(client, worker.url)
                await peer.initialize()
                relisted = (await _result(peer, "tasks/list", {}))["tasks"]  # from the journal, before any get
                assert [(t["taskId"], t["status"]) for t in relisted] == [
                    (created["taskId"], "completed"), (held["taskId"], "cancelled")], relisted
                assert relisted[0]["createdAt"] == created["createdAt"], relisted
                after = await _result(peer, "tasks/get", {"taskId": created["taskId"]})
                assert after["status"] == "completed" and after["taskId"] == created["taskId"], after
                again_result = await _result(peer, "tasks/result", {"taskId": created["taskId"]})
                again_result.pop("_meta")
                assert again_result == result
                gone = await _result(peer, "tasks/get", {"taskId": held["taskId"]})
                assert gone["status"] == "cancelled", gone


async def test_without_serve_tasks_nothing_changes() -> None:
    async with scripted_gateway(default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            with trio.fail_after(60):
                peer = LegacyPeer(client, worker.url)
                init = await peer.initialize()
                assert init["capabilities"] == SERVED, init
                tools = (await _result(peer, "tools/list", {}))["tools"]
                assert all("execution" not in t for t in tools)
                # params.task is ignored, as by any server that does not declare tasks: an ordinary answer.
                plain = await _result(peer, "tools/call", _spawn("say fine", ttl=60000))
                assert "task" not in plain and plain["structuredContent"]["status"] == "completed", plain
                for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                    missing = await _error(peer, method, {"taskId": plain["structuredContent"]["handle"]})
                    assert missing["code"] == -32601, (method, missing)
                assert (await _error(peer, "tasks/list", {}))["code"] == -32601


async def test_a_task_is_its_creators_only() -> None:
    async with idp() as authority, scripted_gateway(default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-tasks", "--serve-oauth-issuer", authority.issuer,
                "--intelligence", gw.url]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            with trio.fail_after(60):
                alice, bob = (LegacyPeer(client, worker.url, headers={
                    "authorization": f"Bearer {authority.mint(aud=worker.url, sub=sub)}"}) for sub in ("alice", "bob"))
                for peer in (alice, bob):
                    await peer.initialize()
                task_id = (await _result(alice, "tools/call", _spawn("say fine")))["task"]["taskId"]
                await _until(alice, task_id, "completed")
                mine = (await _result(bob, "tools/call", _spawn("say fine")))["task"]["taskId"]
                assert [t["taskId"] for t in (await _result(alice, "tasks/list", {}))["tasks"]] == [task_id]
                assert [t["taskId"] for t in (await _result(bob, "tasks/list", {}))["tasks"]] == [mine]
                for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                    theirs = await _error(bob, method, {"taskId": task_id})
                    never = await _error(bob, method, {"taskId": "served.9999"})
                    assert json.dumps(theirs).replace(task_id, "T") == json.dumps(never).replace("served.9999", "T")
                assert (await _result(alice, "tasks/get", {"taskId": task_id}))["status"] == "completed"


@pytest.mark.interop
async def test_the_official_sdk_drives_served_tasks() -> None:
    release = trio.Event()
    rules = [({"contains": HOLD}, text("released", wait=release))]
    python = await trio.to_thread.run_sync(ensure_mcp1_venv)
    client = Path(__file__).resolve().parents[1] / "peers" / "clients" / "sdk1_tasks_client.py"
    async with scripted_gateway(rules=rules, default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-tasks", "--intelligence", gw.url,
                "--cancel-grace", "1"]
        async with agentd_worker(argv) as worker:
            with trio.fail_after(90):
                done = await trio.run_process([str(python), str(client), worker.url, "say fine", HOLD],
                                              capture_stdout=True, capture_stderr=True, check=False)
        release.set()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert out["protocol"] == "2025-11-25"
    assert out["capabilities"]["tasks"] == CAPABILITY, out["capabilities"]
    assert out["support"]["subagent.spawn"] == "optional" and out["support"]["status"] is None, out["support"]
    assert out["created"] == "working" and out["seen"][-1] == "completed", out
    assert out["listed"] == [out["task_id"]]
    assert out["result"].pop("_meta") == {RELATED_TASK: {"taskId": out["task_id"]}}
    assert _without_handle(out["result"]) == _without_handle(out["sync"])
    assert out["cancelled"] == "cancelled"


def _modern(method: str, params: dict[str, Any], *, extension: bool = True, id: int = 1) -> dict[str, Any]:
    caps = {"extensions": {"io.modelcontextprotocol/tasks": {}}} if extension else {}
    envelope = {"io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": caps}
    return rpc(method, {**params, "_meta": envelope}, id)


async def _post_modern(client: httpx.AsyncClient, url: str, method: str, params: dict[str, Any],
                       **kw: Any) -> dict[str, Any]:
    name = params.get("taskId") or params.get("name")
    r = await client.post(url, headers=modern_headers(method, name), json=_modern(method, params, **kw))
    return decode_reply(r)


async def test_the_modern_wire_serves_the_tasks_extension_by_default() -> None:
    release, slow = trio.Event(), trio.Event()
    rules = [({"contains": HOLD}, text("released", wait=release)), ({"contains": SLOW}, text("fine", wait=slow))]
    async with scripted_gateway(rules=rules, default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url, "--cancel-grace", "1"]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            with trio.fail_after(60):
                discover = (await _post_modern(client, url, "server/discover", {}))["result"]
                assert discover["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"] == {}
                spawn = {"name": "subagent.spawn", "arguments": {"instruction": "say fine"}}
                plain = (await _post_modern(client, url, "tools/call", spawn, extension=False))["result"]
                assert plain["resultType"] == "complete" and plain["structuredContent"]["status"] == "completed"
                shared = ("content", "structuredContent", "isError")

                # A run that ends within the server's inline wait is answered inline, task extension or not.
                inline = (await _post_modern(client, url, "tools/call", spawn))["result"]
                assert inline["resultType"] == "complete", inline
                assert _without_handle({k: inline[k] for k in shared}) == _without_handle({k: plain[k] for k in shared})

                # One that outlasts it becomes a task, polled to the same result.
                created = (await _post_modern(client, url, "tools/call", {
                    "name": "subagent.spawn", "arguments": {"instruction": SLOW}}))["result"]
                assert created["resultType"] == "task" and created["status"] == "working", created
                assert {"taskId", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"} <= set(created)
                slow.set()
                async def finished() -> dict[str, Any] | None:
                    task = (await _post_modern(client, url, "tasks/get", {"taskId": created["taskId"]}))["result"]
                    return None if task["status"] == "working" else task

                task = await until(finished, timeout=60, what="the task finished")
                assert task["status"] == "completed", task
                assert _without_handle({k: task["result"][k] for k in shared}) == \
                    _without_handle({k: plain[k] for k in shared})

                held = (await _post_modern(client, url, "tools/call", {
                    "name": "subagent.spawn", "arguments": {"instruction": HOLD}}))["result"]
                assert held["resultType"] == "task", held
                cancelled = (await _post_modern(client, url, "tasks/cancel", {"taskId": held["taskId"]}))["result"]
                assert cancelled["status"] == "cancelled", cancelled
                refused = await _post_modern(client, url, "tasks/get", {"taskId": held["taskId"]}, extension=False)
                assert refused["error"]["code"] == -32021, refused
                for method in ("tasks/list", "tasks/result"):  # not in the extension
                    r = await client.post(url, headers=modern_headers(method),
                                          json=_modern(method, {"taskId": held["taskId"]}))
                    assert r.json()["error"]["code"] == -32601, (method, r.text)
        release.set()


async def test_served_tasks_push_their_status_to_a_listen_naming_them() -> None:
    """SEP-2663 status notifications: a ``subscriptions/listen`` whose filter names served task ids (declaring the
    extension) is acknowledged with the caller's own tasks, and each gets one ``notifications/tasks`` (its
    ``tasks/get`` body) when it ends; a task that already ended comes right after the acknowledgement. agentd's
    own client, calling a served spawn that becomes a task, asks for it and is woken by it."""
    from agentd.client import open_mcp_pool
    from tests.client.helpers import Events, server

    slow, later = trio.Event(), trio.Event()
    rules = [({"contains": SLOW}, text("fine", wait=slow)), ({"contains": LATER}, text("later answer", wait=later))]
    async with scripted_gateway(rules=rules, default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            with trio.fail_after(60):
                created = (await _post_modern(client, url, "tools/call", {
                    "name": "subagent.spawn", "arguments": {"instruction": SLOW}}))["result"]
                assert created["resultType"] == "task", created
                task_id = created["taskId"]
                listen = {"notifications": {"taskIds": [task_id, "served.nope"]}}
                r = await client.post(url, headers=modern_headers("subscriptions/listen"),
                                      json=_modern("subscriptions/listen", listen, extension=False))
                assert r.status_code == 400 and r.json()["error"]["code"] == -32021, r.text
                async with client.stream("POST", url, headers=modern_headers("subscriptions/listen"),
                                         json=_modern("subscriptions/listen", listen, id=7)) as stream, \
                        aclosing(_frames(stream)) as frames:
                    ack = await frames.__anext__()
                    assert ack["method"] == "notifications/subscriptions/acknowledged"
                    assert ack["params"]["notifications"] == {"taskIds": [task_id]}, ack
                    slow.set()
                    pushed = await frames.__anext__()
                    assert pushed["method"] == "notifications/tasks", pushed
                    assert pushed["params"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": 7}
                    polled = (await _post_modern(client, url, "tasks/get", {"taskId": task_id}))["result"]
                    assert pushed["params"]["taskId"] == task_id and pushed["params"]["status"] == "completed"
                    assert pushed["params"]["result"] == polled["result"], (pushed, polled)
                async with client.stream("POST", url, headers=modern_headers("subscriptions/listen"),
                                         json=_modern("subscriptions/listen", listen, id=8)) as stream, \
                        aclosing(_frames(stream)) as frames:
                    await frames.__anext__()  # the ack; the ended task's status comes right after it
                    assert (await frames.__anext__())["params"]["status"] == "completed"

            # agentd's own client: the served spawn becomes a task; its end is pushed and wakes the poller.
            events = Events()
            async with open_mcp_pool([server(url, "child", era="modern")], log=events.log) as pool:
                with trio.fail_after(60):
                    async with trio.open_nursery() as nursery:
                        got: list[Any] = []

                        async def call() -> None:
                            got.append(await pool.call_tool("child", "subagent.spawn", {"instruction": LATER}))

                        nursery.start_soon(call)
                        await until(lambda: any(e.get("listen") == "acknowledged"
                                                and "taskIds" in (e.get("notifications") or {})
                                                for e in events.named("mcp.stream")),
                                    timeout=50, what="the poller asking for the task's status pushes")
                        later.set()
            [result] = got
            assert "later answer" in json.dumps(result.structured), result
            (task_id,) = {e["task_id"] for e in events.named("mcp.task")}
            assert [e["task_id"] for e in events.named("mcp.task_pushed")] == [task_id]


async def _frames(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    from agentd.mcp.sse import SseDecoder

    decoder = SseDecoder()
    async for chunk in response.aiter_bytes():
        for event in decoder.feed(chunk):
            if event.data:
                yield json.loads(event.data)


async def test_a_legacy_task_pushes_its_end_on_the_sessions_get_stream() -> None:
    """2025-11-25 with ``--serve-tasks``: a task's end is ``notifications/tasks/status`` (its ``tasks/get`` body)
    on the GET stream of the session that created it; another session's stream does not get it."""
    slow = trio.Event()
    rules = [({"contains": SLOW}, text("fine", wait=slow))]
    async with scripted_gateway(rules=rules, default=text("fine")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-tasks", "--intelligence", gw.url]
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            with trio.fail_after(60):
                peer, other = LegacyPeer(client, worker.url), LegacyPeer(client, worker.url)
                await peer.initialize()
                await other.initialize()
                async with client.stream("GET", worker.url, headers=peer.headers()) as mine, \
                        client.stream("GET", worker.url, headers=other.headers()) as theirs, \
                        aclosing(_frames(mine)) as frames, aclosing(_frames(theirs)) as their_frames:
                    created = (await _result(peer, "tools/call", _spawn(SLOW, ttl=60000)))["task"]
                    slow.set()
                    pushed = await frames.__anext__()
                    assert pushed["method"] == "notifications/tasks/status", pushed
                    polled = await _result(peer, "tasks/get", {"taskId": created["taskId"]})
                    assert pushed["params"] == polled, (pushed, polled)
                    assert polled["status"] == "completed"
                    await _result(other, "tools/call", _spawn("say fine", ttl=60000))  # its own task
                    theirs_first = await their_frames.__anext__()
                    assert theirs_first["params"]["taskId"] != created["taskId"], theirs_first
