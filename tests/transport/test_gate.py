"""agentd.transport.gate through the real server: Host and Origin (403), the static bearer (401 with its
challenge), an OAuth token (401 with ``resource_metadata`` without one, 403 without the scope) with the static
bearer accepted beside it, and who passed, as an app behind the gate sees it."""

from __future__ import annotations

import httpx
import pytest

from agentd.connections.auth import parse_challenge
from agentd.mcp.server_session import HttpReply
from agentd.transport.asgi import Receive, Scope, Send, request_headers, send_reply
from agentd.transport.gate import LOOPBACK_HOSTS, Gate
from agentd.transport.mounts import Mount, Mounts
from agentd.transport.resource_server import OAuthSettings, ResourceServer
from tests.security.idp import idp
from tests.transport.served import served

SCOPE = "agentd:serve"


def behind(gate: Gate) -> Mounts:
    """A table of one app that answers who the gate let through (its refusal otherwise)."""
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        verdict = await gate.admit(request_headers(scope))
        if isinstance(verdict, HttpReply):
            await send_reply(send, verdict)
        else:
            await send_reply(send, HttpReply(200, f"in as {verdict.key or 'local'}".encode(), "text/plain"))

    return Mounts(http=[Mount("/in", app)])


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 200),
    ({"host": "localhost:1"}, 200),
    ({"host": "[::1]:1"}, 200),
    ({"host": "evil.example"}, 403),
    ({"host": "127.0.0.1@evil.example"}, 403),
    ({"origin": "http://127.0.0.1:5"}, 200),
    ({"origin": "http://evil.example"}, 403),
    ({"origin": "null"}, 403),
])
async def test_host_and_origin_of_a_loopback_listener(headers: dict[str, str], status: int) -> None:
    async with served(behind(Gate(allowed_hosts=LOOPBACK_HOSTS))) as s, httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{s.port}/in", headers=headers)
        assert response.status_code == status
        if status == 403:
            assert "not allowed" in response.json()["error"]["message"]


async def test_any_host_takes_only_a_same_host_origin() -> None:
    async with served(behind(Gate(allowed_hosts=None))) as s, httpx.AsyncClient() as client:
        url = f"http://127.0.0.1:{s.port}/in"
        assert (await client.get(url, headers={"host": "agent.example"})).status_code == 200
        same = {"host": "agent.example", "origin": "https://agent.example"}
        assert (await client.get(url, headers=same)).status_code == 200
        other = {"host": "agent.example", "origin": "https://other.example"}
        assert (await client.get(url, headers=other)).status_code == 403


async def test_the_static_bearer_is_checked_and_challenged() -> None:
    async with served(behind(Gate(bearer="s3cret-bearer"))) as s, httpx.AsyncClient() as client:
        url = f"http://127.0.0.1:{s.port}/in"
        for authorization in (None, "Bearer wrong", "Basic s3cret-bearer"):
            refused = await client.get(url, headers={"authorization": authorization} if authorization else {})
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"] == 'Bearer realm="agentd"'
            assert "s3cret" not in refused.text
        ok = await client.get(url, headers={"authorization": "Bearer s3cret-bearer"})
        assert (ok.status_code, ok.text) == (200, "in as local")


async def test_an_oauth_token_or_the_static_bearer_beside_it() -> None:
    async with idp() as authority:
        oauth = ResourceServer(OAuthSettings(authority.issuer, None, (SCOPE,)))
        gate = Gate(bearer="static-bearer", oauth=oauth)
        async with served(behind(gate)) as s, httpx.AsyncClient() as client:
            resource = f"http://127.0.0.1:{s.port}/mcp"
            oauth.bind(resource)
            url = f"http://127.0.0.1:{s.port}/in"
            missing = await client.get(url)
            assert missing.status_code == 401
            challenge = parse_challenge(missing.headers["www-authenticate"])
            assert challenge["resource_metadata"] == f"http://127.0.0.1:{s.port}/.well-known/oauth-protected-resource/mcp"
            token = authority.mint(aud=resource, scope=SCOPE, sub="alice")
            passed = await client.get(url, headers={"authorization": f"Bearer {token}"})
            assert passed.status_code == 200 and passed.text != "in as local"
            narrow = authority.mint(aud=resource, scope="other", sub="alice")
            assert (await client.get(url, headers={"authorization": f"Bearer {narrow}"})).status_code == 403
            static = await client.get(url, headers={"authorization": "Bearer static-bearer"})
            assert (static.status_code, static.text) == (200, "in as local")
            # Host/Origin come first, token or not
            foreign = await client.get(url, headers={"authorization": f"Bearer {token}", "host": "evil.example"})
            assert foreign.status_code == 403
