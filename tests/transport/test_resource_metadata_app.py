"""agentd.transport.resource_metadata_app through the real server: with ``--serve-oauth-issuer`` the RFC 9728
document answers at both forms (the root and the served path's, which follows the bound port), without a
token but behind Host/Origin, GET only; other paths under the well-known one are 404, and the MCP endpoint
without a token is 401 naming the document in ``resource_metadata``."""

from __future__ import annotations

import httpx

from agentd.connections.auth import parse_challenge
from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
from agentd.transport.resource_server import OAuthSettings, ResourceServer
from tests.transport.served import JSON, EchoHandler, served

ISSUER = "https://as.example"
WELL_KNOWN = "/.well-known/oauth-protected-resource"


async def test_both_forms_without_a_token_get_only_behind_host_and_origin() -> None:
    oauth = ResourceServer(OAuthSettings(ISSUER, None, ("agentd:serve",)))
    app = McpAsgiApp(EchoHandler(), AsgiOptions(paths=frozenset({"/agent", "/mcp"}), oauth=oauth))
    async with served(app, path="/agent") as s, httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.port}") as client:
        resource = f"http://127.0.0.1:{s.port}/agent"
        oauth.bind(resource)
        for path in (WELL_KNOWN, WELL_KNOWN + "/agent"):
            document = await client.get(path)
            assert document.status_code == 200 and document.headers["cache-control"] == "max-age=300"
            assert document.json()["resource"] == resource
            assert document.json()["authorization_servers"] == [ISSUER]
            for method in ("POST", "HEAD"):
                wrong = await client.request(method, path)
                assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET")
            assert (await client.get(path, headers={"host": "evil.example"})).status_code == 403
            assert (await client.get(path, headers={"origin": "http://evil.example"})).status_code == 403
        for other in (WELL_KNOWN + "/mcp", WELL_KNOWN + "/", WELL_KNOWN + "x"):
            assert (await client.get(other)).status_code == 404
        refused = await client.post("/agent", headers=JSON, content=b"{}")
        assert refused.status_code == 401
        metadata = parse_challenge(refused.headers["www-authenticate"])["resource_metadata"]
        assert metadata == f"http://127.0.0.1:{s.port}{WELL_KNOWN}/agent"


async def test_without_oauth_there_is_no_document() -> None:
    async with served(McpAsgiApp(EchoHandler())) as s, httpx.AsyncClient() as client:
        for path in (WELL_KNOWN, WELL_KNOWN + "/mcp"):
            assert (await client.get(f"http://127.0.0.1:{s.port}{path}")).status_code == 404
