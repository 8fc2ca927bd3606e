"""The served A2A endpoint's ``ListTasks``, driven by the official ``a2a-sdk`` 1.3.0 client: paging, filters,
and scoping to the caller (two OAuth subjects on one mTLS listener: neither sees the other's tasks).

A real ``agentd --serve-mcp https://... --serve-a2a`` with ``--serve-oauth-issuer`` (tests/security/idp.py
mints the tokens); its served runs are real children on the offline intelligence.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.security.idp import idp
from tests.security.test_served_oauth import SCOPE, _worker_argv
from tests.selfmcp.certs import make_pki
from tests.selfmcp.test_composition import worker

a2a_client = pytest.importorskip("a2a.client", reason="a2a-sdk (the test extra) is not installed")
from a2a.types.a2a_pb2 import (  # noqa: E402
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]


def _message(text: str, context_id: str | None = None) -> SendMessageRequest:
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text=text)])
    if context_id:
        message.context_id = context_id
    return SendMessageRequest(message=message)


async def _send(client: Any, request: SendMessageRequest) -> Any:
    task = None
    async for response in client.send_message(request):
        if response.WhichOneof("payload") == "task":
            task = response.task
    assert task is not None
    return task


async def test_list_tasks_pages_through_the_callers_own_tasks(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    async with idp() as authority:
        async with worker(_worker_argv(pki, authority.issuer, "--serve-a2a")) as url:
            origin = url.removesuffix("/mcp")
            tokens = {who: authority.mint(aud=url, scope=SCOPE, sub=who) for who in ("alice", "bob")}

            def http(who: str) -> httpx.AsyncClient:
                return httpx.AsyncClient(verify=pki.client_context(pki.client), trust_env=False, timeout=60,
                                         headers={"Authorization": f"Bearer {tokens[who]}"})  # fmt: skip

            async with http("alice") as alice_http, http("bob") as bob_http:
                config = {"streaming": False}
                alice = await a2a_client.create_client(
                    origin + "/a2a", client_config=a2a_client.ClientConfig(httpx_client=alice_http, **config))
                bob = await a2a_client.create_client(
                    origin + "/a2a", client_config=a2a_client.ClientConfig(httpx_client=bob_http, **config))
                with trio.fail_after(120):
                    first = await _send(alice, _message("turn one"))
                    assert first.status.state == TaskState.TASK_STATE_COMPLETED
                    ids = [first.id]
                    for text in ("turn two", "turn three"):
                        ids.append((await _send(alice, _message(text, first.context_id))).id)

                    page = await alice.list_tasks(ListTasksRequest(page_size=2))
                    assert [t.id for t in page.tasks] == ids[::-1][:2]  # newest first
                    assert page.total_size == 3 and page.page_size == 2 and page.next_page_token
                    assert not any(t.artifacts for t in page.tasks)  # includeArtifacts defaults to false
                    rest = await alice.list_tasks(ListTasksRequest(page_size=2, page_token=page.next_page_token))
                    assert [t.id for t in rest.tasks] == ids[:1] and rest.next_page_token == ""
                    full = await alice.list_tasks(ListTasksRequest(context_id=first.context_id,
                                                                   include_artifacts=True,
                                                                   status=TaskState.TASK_STATE_COMPLETED))
                    assert len(full.tasks) == 3 and all(t.artifacts for t in full.tasks)
                    assert (await alice.list_tasks(ListTasksRequest(context_id="elsewhere"))).total_size == 0

                    # bob sees none of it: not in his list, not by id, not by context
                    assert (await bob.list_tasks(ListTasksRequest())).total_size == 0
                    with pytest.raises(Exception) as info:
                        await bob.get_task(GetTaskRequest(id=first.id))
                    assert type(info.value).__name__ == "TaskNotFoundError"
                    with pytest.raises(Exception, match="contextId is in use"):
                        await _send(bob, _message("join in", first.context_id))

                    # a bad page token or size is invalid params
                    for bad in (ListTasksRequest(page_token="bm90LWEtbnVtYmVy"), ListTasksRequest(page_size=500)):
                        with pytest.raises(Exception) as info:
                            await alice.list_tasks(bad)
                        assert "page" in str(info.value).lower()
