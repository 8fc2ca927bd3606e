"""Tenants across a cluster: a cluster handle is its spawner's on every member.

Two real ``agentd --cluster --serve-mcp --serve-oauth-issuer`` members against a real PostgreSQL and the test
authorization server: alice spawns an async (cluster) run on member 0; on member 1, which did not spawn it,
bob's status, read and subscribe answer exactly as for a handle never issued, while alice's and the
operator's answer. The owner travels in the work row's payload.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.cluster.test_members import _member_argv, _members, _served_url
from tests.peers.gateway import scripted_gateway, text
from tests.security.idp import idp
from tests.security.test_tenants import OPERATOR, _as_never_issued, _good, _peer, _token, _tool

pytestmark = [pytest.mark.slow]


async def test_a_cluster_handle_is_its_spawners_on_every_member(pg_dsn: str, tmp_path: Path) -> None:
    async with idp() as authority, scripted_gateway(default=text("alice's answer", delay=1.0)) as gw:
        argv = _member_argv(pg_dsn, gw, None, "--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-oauth-issuer",
                            authority.issuer, "--serve-oauth-operator-scope", OPERATOR,
                            "--serve-oauth-audience", "http://agentd.test/mcp")
        async with _members(argv, 2, tmp_path):
            urls = [_served_url(tmp_path / f"member{i}.stderr") for i in range(2)]
            audience = "http://agentd.test/mcp"  # one audience for the whole cluster
            alice_token, bob_token = _token(authority, audience, "alice"), _token(authority, audience, "bob")
            ops_token = _token(authority, audience, "ops", OPERATOR)
            async with httpx.AsyncClient(timeout=30) as client:
                alice0 = _peer(client, urls[0], alice_token)
                alice1, bob1, ops1 = (_peer(client, urls[1], t) for t in (alice_token, bob_token, ops_token))
                for peer in (alice0, alice1, bob1, ops1):
                    await peer.initialize()
                spawned = await _tool(alice0, "subagent.spawn", {"instruction": "answer it", "async": True})
                handle = spawned["structuredContent"]["handle"]
                assert handle.startswith("cluster.")
                await _as_never_issued(bob1, handle)
                assert (await _good(alice1, handle))["handle"] == handle
                assert (await _tool(ops1, "subagent.status", {"handle": handle}))["isError"] is False
                await _as_never_issued(bob1, handle)  # now that member 1 tracks it too
