"""agentd as an A2A server (``--serve-mcp ... --serve-a2a``), driven by the official ``a2a-sdk`` 1.3.0 client.

The worker is a real agentd process whose served runs are real re-exec'd children; their intelligence is a
scripted gateway in this test (it echoes the last message, hangs on "slow", fails on "fail"). The SDK client
runs inside the trio test (it is httpx-based). Card, send, stream, a two-turn conversation on one context
id, cancel, an unknown task, a failing task; then bad input on the served endpoint while a good client is
still served.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
import trio

from tests.peers.gateway import scripted_gateway, status
from tests.selfmcp.test_composition import worker

a2a_client = pytest.importorskip("a2a.client", reason="a2a-sdk (the test extra) is not installed")
from a2a.types.a2a_pb2 import (  # noqa: E402
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

RULES = [
    ({"last_contains": "slow"}, {"content": "late", "delay": 120}),
    ({"last_contains": "fail"}, status(400)),
]


def _message(text: str, context_id: str | None = None) -> SendMessageRequest:
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text=text)])
    if context_id:
        message.context_id = context_id
    return SendMessageRequest(message=message)


async def _client(url: str, *, streaming: bool, http: httpx.AsyncClient) -> Any:
    config = a2a_client.ClientConfig(streaming=streaming, httpx_client=http)
    return await a2a_client.create_client(url + "/a2a", client_config=config)


async def _final(client: Any, request: SendMessageRequest) -> tuple[Any, list[str]]:
    kinds: list[str] = []
    task = None
    async for response in client.send_message(request):
        kind = response.WhichOneof("payload")
        kinds.append(kind)
        if kind == "task":
            task = response.task
        elif kind == "status_update" and task is not None:
            task.status.CopyFrom(response.status_update.status)
        elif kind == "artifact_update" and task is not None:
            task.artifacts.append(response.artifact_update.artifact)
    assert task is not None
    return task, kinds


def _text(task: Any) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


async def test_sdk_client_drives_agentd() -> None:
    lines: list[str] = []
    async with scripted_gateway(rules=RULES, default={"echo_last": True}) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0", "--serve-a2a", "--intelligence", gw.url]
        async with worker(argv, stderr_lines=lines) as url, httpx.AsyncClient(timeout=60) as http:
            url = url.removesuffix("/mcp")  # serve.start advertises the MCP endpoint; A2A hangs off the origin
            with trio.fail_after(120):
                card = (await http.get(url + "/.well-known/agent-card.json")).json()
                assert card["supportedInterfaces"][0] == {
                    "url": url + "/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
                assert card["capabilities"]["streaming"] is True and card["skills"][0]["id"] == "run"

                plain = await _client(url, streaming=False, http=http)
                task, kinds = await _final(plain, _message("hello agentd"))
                assert kinds == ["task"] and task.status.state == TaskState.TASK_STATE_COMPLETED
                assert "hello agentd" in _text(task)
                # the second turn on the same context id reaches the same warm session
                again, _ = await _final(plain, _message("and a second turn", task.context_id))
                assert again.context_id == task.context_id and "second turn" in _text(again)
                served = [json.loads(x) for x in lines if '"a2a.served"' in x]
                handles = {e["handle"] for e in served if e.get("context_id") == task.context_id}
                assert len(handles) == 1 and len([e for e in served if e.get("context_id") == task.context_id]) == 2

                streaming = await _client(url, streaming=True, http=http)
                streamed, kinds = await _final(streaming, _message("streamed please"))
                assert kinds[0] == "task" and kinds[-1] == "status_update" and "artifact_update" in kinds
                assert streamed.status.state == TaskState.TASK_STATE_COMPLETED and "streamed please" in _text(streamed)

                got = await plain.get_task(GetTaskRequest(id=task.id))
                assert got.status.state == TaskState.TASK_STATE_COMPLETED

                # a failing run is a failed task, not a protocol error
                failed, _ = await _final(plain, _message("please fail"))
                assert failed.status.state == TaskState.TASK_STATE_FAILED

                # cancel a running task: start it with returnImmediately, then CancelTask
                request = _message("slow work")
                request.configuration.return_immediately = True
                started, _ = await _final(plain, request)
                assert started.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
                # SubscribeToTask (the SDK's resubscribe): the running task, then its end when it is cancelled
                streaming_sub = await _client(url, streaming=True, http=http)
                seen: list[Any] = []
                first = trio.Event()

                async def follow() -> None:
                    async for response in streaming_sub.subscribe(SubscribeToTaskRequest(id=started.id)):
                        seen.append(response)
                        first.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(follow)
                    await first.wait()
                    assert seen[0].WhichOneof("payload") == "task" and seen[0].task.id == started.id
                    cancelled = await plain.cancel_task(CancelTaskRequest(id=started.id))
                assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
                assert seen[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
                with pytest.raises(Exception, match="cannot be canceled"):
                    await plain.cancel_task(CancelTaskRequest(id=started.id))

                # an unknown task is the typed A2A error
                with pytest.raises(Exception) as info:
                    await plain.get_task(GetTaskRequest(id="no-such-task"))
                assert type(info.value).__name__ == "TaskNotFoundError"


async def test_bad_input_on_the_served_endpoint() -> None:
    async with scripted_gateway(default={"echo_last": True}) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0", "--serve-a2a", "--intelligence", gw.url,
                "--serve-max-body", "65536"]
        async with worker(argv) as url, httpx.AsyncClient(timeout=60) as http:
            url = url.removesuffix("/mcp")  # serve.start advertises the MCP endpoint; A2A hangs off the origin
            rpc = url + "/a2a"
            headers = {"content-type": "application/json", "A2A-Version": "1.0"}

            async def post(body: bytes | str) -> httpx.Response:
                return await http.post(rpc, content=body, headers=headers)

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    good: list[str] = []

                    async def good_client() -> None:
                        client = await _client(url, streaming=False, http=http)
                        for n in range(3):
                            task, _ = await _final(client, _message(f"good {n}"))
                            good.append(_text(task))

                    nursery.start_soon(good_client)
                    assert (await post(b"{not json")).json()["error"]["code"] == -32700
                    assert (await post(b"[1, 2]")).json()["error"]["code"] == -32600
                    assert (await post(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "Nope", "params": {}}))
                            ).json()["error"]["code"] == -32601
                    bad_params = {"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {"message": {"parts": []}}}
                    assert (await post(json.dumps(bad_params))).json()["error"]["code"] == -32602
                    huge = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {
                        "message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x" * 200_000}]}}})
                    assert (await post(huge)).status_code == 413
                    unknown = {"jsonrpc": "2.0", "id": 4, "method": "GetTask", "params": {"id": "nope"}}
                    assert (await post(json.dumps(unknown))).json()["error"]["code"] == -32001
                assert [g.startswith("good") or "good" in g for g in good] == [True, True, True]


async def test_bearer_is_required_on_the_a2a_paths() -> None:
    token = "a2a-served-bearer-5678"
    async with scripted_gateway(default={"echo_last": True}) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0", "--serve-a2a", "--intelligence", gw.url,
                "--serve-bearer", "{{secret:WORKER_TOKEN}}"]
        async with worker(argv, env={"WORKER_TOKEN": token}) as url:
            url = url.removesuffix("/mcp")  # serve.start advertises the MCP endpoint; A2A hangs off the origin
            with trio.fail_after(60):
                async with httpx.AsyncClient(timeout=30) as anonymous:
                    assert (await anonymous.get(url + "/.well-known/agent-card.json")).status_code == 401
                    assert (await anonymous.post(url + "/a2a", content=b"{}")).status_code == 401
                auth = {"Authorization": f"Bearer {token}"}
                async with httpx.AsyncClient(timeout=60, headers=auth) as http:
                    client = await _client(url, streaming=True, http=http)
                    task, _ = await _final(client, _message("with a bearer"))
                    assert task.status.state == TaskState.TASK_STATE_COMPLETED
