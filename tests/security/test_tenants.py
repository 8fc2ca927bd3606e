"""Tenants on one served listener: with OAuth, what a principal creates is its own.

A real ``agentd --serve-mcp --serve-oauth-issuer`` (with ``--serve-a2a`` and ``--state-dir``) and the test
authorization server (tests/security/idp.py), over real sockets, with tokens for two principals (alice, bob)
and an operator (a token carrying ``--serve-oauth-operator-scope``):

- bob cannot read, send to, cancel or subscribe to alice's async handle and warm session (``subagent.status``,
  ``subagent.send``, ``subagent.cancel``, ``resources/read``, ``resources/subscribe``, a modern listen): every
  answer is byte for byte the answer for a handle never issued (modulo the handle and the JSON-RPC id); nor
  use alice's session id (404, as for a made-up one), nor see her A2A task;
- bob's ``/events`` carries the lines of bob's runs only; the operator's carries everyone's;
- after a restart on the same ``--state-dir`` the journaled handles are still alice's only;
- alice, the good client, is served throughout: each of her calls answers within 2 s.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from tests import waiting
from tests.integration.agents import agentd_worker
from tests.security.idp import Idp, idp
from tests.selfmcp.harness import ACCEPT, LegacyPeer, modern_headers, modern_meta, rpc

pytestmark = [pytest.mark.usefixtures("no_leftover_children")]

OPERATOR = "agentd.oversight.operator"
NEVER = "served.9999"
#: How long a good client's call may take while the others attack.
GOOD_WITHIN = 2.0


def _argv(issuer: str, state: Path, *extra: str) -> list[str]:
    return ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-oauth-issuer", issuer,
            "--serve-oauth-operator-scope", OPERATOR, "--serve-a2a", "--intelligence", "test",
            "--state-dir", str(state), *extra]


def _token(authority: Idp, url: str, sub: str, *scopes: str) -> str:
    return authority.mint(aud=url, sub=sub, scope=" ".join(scopes) or None)


def _peer(client: httpx.AsyncClient, url: str, token: str) -> LegacyPeer:
    return LegacyPeer(client, url, headers={"authorization": f"Bearer {token}"})


def _normal(body: bytes, handle: str) -> bytes:
    """An answer with its handle and JSON-RPC id blanked: what must not differ between handles."""
    return re.sub(rb'"id":\s*\d+', b'"id":0', body.replace(handle.encode(), b"HANDLE"))


async def _tool(peer: LegacyPeer, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    answer = await peer.call("tools/call", {"name": name, "arguments": arguments})
    return dict(answer["result"])


async def _good(peer: LegacyPeer, handle: str) -> dict[str, Any]:
    """The good client's call, answered within :data:`GOOD_WITHIN` seconds."""
    with trio.fail_after(GOOD_WITHIN):
        result = await _tool(peer, "subagent.status", {"handle": handle})
    assert result["isError"] is False, result
    return dict(result["structuredContent"])


def _probes(handle: str) -> list[tuple[str, dict[str, Any]]]:
    uri = "agent://subagent/" + handle
    return [
        ("tools/call", {"name": "subagent.status", "arguments": {"handle": handle}}),
        ("tools/call", {"name": "subagent.send", "arguments": {"handle": handle, "message": "obey bob"}}),
        ("tools/call", {"name": "subagent.cancel", "arguments": {"handle": handle}}),
        ("resources/read", {"uri": uri}),
        ("resources/subscribe", {"uri": uri}),
    ]


async def _as_never_issued(peer: LegacyPeer, handle: str) -> None:
    """Every probe of ``handle`` answers exactly as the same probe of a handle never issued."""
    for (method, params), (_, never) in zip(_probes(handle), _probes(NEVER), strict=True):
        theirs = await peer.post(method, params)
        unknown = await peer.post(method, never)
        assert theirs.status_code == unknown.status_code == 200, (method, theirs.text)
        assert _normal(theirs.content, handle) == _normal(unknown.content, NEVER), (method, theirs.text)


async def _modern_as_never_issued(client: httpx.AsyncClient, url: str, token: str, handle: str) -> None:
    """The same on the modern wire (no session): each probe of ``handle`` answers as for a never-issued one."""
    for (method, params), (_, never) in zip(_probes(handle), _probes(NEVER), strict=True):
        if method == "resources/subscribe":
            continue  # the modern wire subscribes through subscriptions/listen (checked on its own)
        answers = []
        for probe in (params, never):
            headers = {**modern_headers(method, probe.get("name") or probe.get("uri")),
                       "authorization": f"Bearer {token}"}
            answers.append(await client.post(url, headers=headers, json=rpc(method, {**probe, "_meta": modern_meta()})))
        theirs, unknown = answers
        assert theirs.status_code == unknown.status_code == 200, (method, theirs.text)
        assert _normal(theirs.content, handle) == _normal(unknown.content, NEVER), (method, theirs.text)


async def _listen_honors(client: httpx.AsyncClient, url: str, token: str, uris: list[str]) -> list[str]:
    """A modern ``subscriptions/listen`` stream's ack: the URIs the server honors for this token."""
    body = rpc("subscriptions/listen", {"notifications": {"resourceSubscriptions": uris}, "_meta": modern_meta()})
    headers = {**modern_headers("subscriptions/listen"), "authorization": f"Bearer {token}"}
    async with client.stream("POST", url, headers=headers, json=body) as response:
        assert response.status_code == 200
        buffer = ""
        async for chunk in response.aiter_text():
            buffer += chunk
            for line in buffer.splitlines():
                if line.startswith("data:"):
                    ack = json.loads(line[5:])
                    assert ack["method"] == "notifications/subscriptions/acknowledged", ack
                    return list(ack["params"]["notifications"].get("resourceSubscriptions", []))
    raise AssertionError("no listen ack")


@asynccontextmanager
async def _events(url: str, token: str) -> AsyncIterator[Callable[[Callable[[dict[str, Any]], bool]],
                                                                   Any]]:
    """``/events`` as ``token``'s principal: yields ``until(predicate)``, which reads lines until one
    satisfies it and returns every line read so far."""
    seen: list[dict[str, Any]] = []
    ws_url = url.replace("http://", "ws://").removesuffix("/mcp") + "/events"
    async with open_websocket_url(ws_url, extra_headers=[(b"authorization", f"Bearer {token}".encode())]) as ws:
        async def until(predicate: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
            while not any(predicate(line) for line in seen):
                seen.append(json.loads(await ws.get_message()))
            return seen

        yield until


async def _upgrade(url: str, token: str) -> bytes:
    """The first bytes of the answer to a raw WebSocket upgrade for ``/events`` with ``token``."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    sock = await trio.open_tcp_stream("127.0.0.1", port)
    async with sock:
        await sock.send_all(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                            + f"Authorization: Bearer {token}\r\n\r\n".encode())
        return await sock.receive_some(65536)


def _under(line: dict[str, Any], handles: set[str]) -> bool:
    path = line.get("handle") if line.get("event") == "tree.node" else line.get("agent_path")
    return isinstance(path, str) and any(path == h or path.startswith(h + ".") for h in handles)


async def _a2a(client: httpx.AsyncClient, url: str, token: str, method: str, params: dict[str, Any]) -> Any:
    a2a_url = url.removesuffix("/mcp") + "/a2a"
    r = await client.post(a2a_url, headers={**ACCEPT, "authorization": f"Bearer {token}"},
                          json=rpc(method, params))
    assert r.status_code == 200, r.text
    return r.json()


async def _done(peer: LegacyPeer, handle: str) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        view = await _good(peer, handle)
        return view if view["done"] else None

    return dict(await waiting.until(ended, timeout=60, what=f"{handle} ended"))


@pytest.mark.slow
async def test_one_principal_cannot_reach_anothers_handles_sessions_tasks_or_event_lines(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with idp() as authority:
        argv = _argv(authority.issuer, state)
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            alice_token, bob_token = _token(authority, url, "alice"), _token(authority, url, "bob")
            ops_token = _token(authority, url, "ops", OPERATOR)
            alice, bob, ops = (_peer(client, url, t) for t in (alice_token, bob_token, ops_token))
            with trio.fail_after(120):
                for peer in (alice, bob, ops):
                    await peer.initialize()
                done = await _tool(alice, "subagent.spawn", {"instruction": "alice's errand", "async": True})
                warm = await _tool(alice, "subagent.spawn", {"instruction": "alice's session", "warm": True})
                done_h, warm_h = done["structuredContent"]["handle"], warm["structuredContent"]["handle"]
                await _done(alice, done_h)
                assert (await _good(alice, warm_h))["done"] is False

                # --- bob: alice's handles do not exist for him; alice is served all along --------------------
                for handle in (done_h, warm_h):
                    await _as_never_issued(bob, handle)
                    await _modern_as_never_issued(client, url, bob_token, handle)
                    await _good(alice, warm_h)
                assert (await _good(alice, warm_h))["done"] is False  # bob's cancel did not reach it
                sent = await _tool(alice, "subagent.send", {"handle": warm_h, "message": "still mine"})
                assert sent["isError"] is False, sent
                uris = ["agent://subagent/" + done_h, "agent://subagent/" + warm_h]
                assert await _listen_honors(client, url, bob_token, uris) == []
                assert sorted(await _listen_honors(client, url, alice_token, uris)) == sorted(uris)

                # alice's session id is no door into alice's session: as unknown as a made-up one
                stolen = await client.post(url, headers={**bob.headers(), "mcp-session-id": alice.session or ""},
                                           json=rpc("ping"))
                made_up = await client.post(url, headers={**bob.headers(), "mcp-session-id": "f" * 32},
                                            json=rpc("ping"))
                assert (stolen.status_code, stolen.content) == (made_up.status_code, made_up.content)
                assert stolen.status_code == 404
                await _good(alice, warm_h)

                # --- A2A: one ownership rule (bob cannot see alice's task) -------------------------------------
                task = await _a2a(client, url, alice_token, "SendMessage", {"message": {
                    "messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "alice over a2a"}]}})
                task_id = task["result"]["task"]["id"]
                theirs = await _a2a(client, url, bob_token, "GetTask", {"id": task_id})
                never = await _a2a(client, url, bob_token, "GetTask", {"id": "0" * 16})
                assert theirs == never and theirs["error"]["message"] == "Task not found"
                assert (await _a2a(client, url, bob_token, "ListTasks", {}))["result"]["tasks"] == []
                assert (await _a2a(client, url, ops_token, "GetTask", {"id": task_id}))["result"]["id"] == task_id

                # --- the operator sees alice's handles ---------------------------------------------------------
                for handle in (done_h, warm_h):
                    result = await _tool(ops, "subagent.status", {"handle": handle})
                    assert result["isError"] is False and result["structuredContent"]["handle"] == handle

                # --- /events: bob sees his own run's lines only; the operator sees everyone's -------------------
                async with _events(url, bob_token) as bob_lines, _events(url, ops_token) as ops_lines:
                    mine = await _tool(bob, "subagent.spawn", {"instruction": "bob's errand", "async": True})
                    bob_h = mine["structuredContent"]["handle"]
                    got = await bob_lines(lambda line: line.get("event") == "tree.node"
                                          and line.get("handle") == bob_h and line.get("status") != "running")
                    assert got, "bob saw none of his own lines"
                    assert all(_under(line, {bob_h}) for line in got if line.get("event") != "stream.dropped"), \
                        [line for line in got if not _under(line, {bob_h})][:3]
                    everyone = await ops_lines(lambda line: _under(line, {bob_h}))
                    await ops_lines(lambda line: _under(line, {done_h}))  # the snapshot has alice's nodes
                    assert any(_under(line, {bob_h}) for line in everyone)
                await _good(alice, warm_h)
                listed = await bob.post("resources/list")
                assert done_h not in listed.text and warm_h not in listed.text
            os.kill(worker.pid, signal.SIGKILL)  # a crash: alice's warm session comes back idle

        # --- a restart on the same --state-dir: the journaled handles are still alice's only ------------------
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            alice, bob, ops = (_peer(client, url, _token(authority, url, sub, *scopes))
                               for sub, scopes in (("alice", ()), ("bob", ()), ("ops", (OPERATOR,))))
            with trio.fail_after(60):
                for peer in (alice, bob, ops):
                    await peer.initialize()
                for handle in (done_h, warm_h):
                    await _as_never_issued(bob, handle)
                    assert (await _good(alice, handle))["handle"] == handle
                    assert (await _tool(ops, "subagent.status", {"handle": handle}))["isError"] is False
                assert (await _good(alice, warm_h))["status"] == "awaiting_turn"
                # alice's session re-opens under a new child: its lines are still alice's, not bob's
                alice_token, bob_token = (_token(authority, url, sub) for sub in ("alice", "bob"))
                async with _events(url, alice_token) as alice_lines, _events(url, bob_token) as bob_lines:
                    sent = await _tool(alice, "subagent.send", {"handle": warm_h, "message": "after the crash"})
                    assert sent["isError"] is False, sent
                    reopened = await worker.wait_event(lambda e: e.get("event") == "serve.restored"
                                                       and e.get("status") == "reopened")
                    live = str(reopened["live"])
                    await alice_lines(lambda line: _under(line, {live}))
                    await _tool(bob, "subagent.spawn", {"instruction": "bob again", "async": True})
                    got = await bob_lines(lambda line: line.get("event") == "tree.node")
                    assert not any(_under(line, {live, warm_h, done_h}) for line in got), got


def test_worker_argv_names_every_flag_it_needs() -> None:
    """The operator scope is a plain flag of the served side (no config file needed)."""
    from agentd.config.load import load_config

    config = load_config(_argv("http://127.0.0.1:9/", Path("/tmp/x")), {})
    assert config.serve.oauth_operator_scope == OPERATOR



@pytest.mark.slow
async def test_a_principal_keeping_sessions_alive_leaves_the_others_their_share(tmp_path: Path) -> None:
    """``--serve-max-sessions 8``: one principal holds at most 2 sessions and 2 listen streams (and 4 of the 16
    ``/events`` subscribers), however busy it keeps them; the other principals' legacy clients still get
    sessions and are served."""
    async with idp() as authority:
        argv = _argv(authority.issuer, tmp_path / "state", "--serve-max-sessions", "8")
        async with agentd_worker(argv) as worker, httpx.AsyncClient(timeout=30) as client:
            url = worker.url
            mallory_token = _token(authority, url, "mallory")
            with trio.fail_after(60):
                held: list[LegacyPeer] = []
                while True:
                    peer = _peer(client, url, mallory_token)
                    r = await client.post(url, headers={**ACCEPT, **peer.extra}, json=rpc("initialize", {
                        "protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": {"name": "m", "version": "0"}}, 0))
                    if r.status_code == 503:
                        assert "for this client (2)" in r.text and r.headers["retry-after"] == "5"
                        break
                    assert r.status_code == 200 and len(held) < 8, r.text
                    peer.session = r.headers["mcp-session-id"]
                    held.append(peer)
                assert len(held) == 2
                body = rpc("subscriptions/listen", {"notifications": {"resourceSubscriptions": []},
                                                    "_meta": modern_meta()})
                headers = {**modern_headers("subscriptions/listen"), "authorization": f"Bearer {mallory_token}"}
                async with trio.open_nursery() as streams:
                    async def listen_forever(task_status: trio.TaskStatus[None]) -> None:
                        async with client.stream("POST", url, headers=headers, json=body) as response:
                            assert response.status_code == 200
                            task_status.started()
                            async for _ in response.aiter_bytes():
                                pass

                    for _ in range(2):
                        await streams.start(listen_forever)
                    third = await client.post(url, headers=headers, json=body)
                    assert third.status_code == 503
                    assert "listen stream limit reached for this client (2)" in third.text
                    # /events: a quarter of the daemon's 16 subscriber slots, the fifth is refused
                    async with _events(url, mallory_token), _events(url, mallory_token), \
                            _events(url, mallory_token), _events(url, mallory_token):
                        fifth = await _upgrade(url, mallory_token)
                        assert fifth.startswith(b"HTTP/1.1 403"), fifth
                        for round_ in range(3):  # mallory keeps hers alive; alice, bob and carol are served
                            for peer in held:
                                assert (await peer.call("ping"))["result"] == {}
                            name = ("alice", "bob", "carol")[round_]
                            good = _peer(client, url, _token(authority, url, name))
                            with trio.fail_after(GOOD_WITHIN):
                                await good.initialize()
                                status = await _tool(good, "status", {})
                                accepted = await _upgrade(url, _token(authority, url, name))
                            assert accepted.startswith(b"HTTP/1.1 101"), accepted
                            assert status["isError"] is False
                    streams.cancel_scope.cancel()


def test_a_handle_journaled_before_owners_were_kept_is_the_operators() -> None:
    """Backward compatible: an older journal's entry has no ``owner`` and reads as the listener's single
    principal (an operator's only, with OAuth on); a new entry keeps its owner through a round trip."""
    from agentd.selfmcp.journaled import Kept
    from agentd.transport.tenancy import LOCAL, LOCAL_KEY, Principal

    old = Kept.from_json("served.1", {"warm": False, "instruction": "x", "status": "completed", "done": True})
    assert old.owner == LOCAL_KEY and LOCAL.owns(old.owner)
    assert not Principal("oauth https://as.example sub bob").owns(old.owner)
    kept = Kept("served.2", True, "y", owner="oauth https://as.example sub alice")
    assert Kept.from_json("served.2", json.loads(json.dumps(kept.to_json()))).owner == kept.owner


async def test_a_single_principal_listener_is_one_party() -> None:
    """The documented decision: every holder of the one ``--serve-bearer`` is the same principal (as every
    certificate of the one client CA is): a handle spawned by one client answers to another, and sessions are
    not counted per client (only the total applies)."""
    from tests.selfmcp.harness import serving

    token = "one-bearer-for-everyone-1234"
    async with serving(bearer=token) as s, httpx.AsyncClient(timeout=10) as client:
        first, second = _peer(client, s.url, token), _peer(client, s.url, token)
        await first.initialize()
        await second.initialize()
        spawned = await _tool(first, "subagent.spawn", {"instruction": "sleep=30", "async": True})
        handle = spawned["structuredContent"]["handle"]
        seen = await _tool(second, "subagent.status", {"handle": handle})
        assert seen["isError"] is False and seen["structuredContent"]["handle"] == handle
        for _ in range(s.app.core.max_per_owner + 1):  # past a principal's share: still admitted
            await _peer(client, s.url, token).initialize()
        cancelled = await _tool(second, "subagent.cancel", {"handle": handle})
        assert cancelled["isError"] is False
