"""agentd.transport.probes_app through the real server, on the self-MCP listener's table: ``/healthz`` and
``/readyz`` answer GET and HEAD without authentication (even where the MCP endpoint needs a bearer) and say
ok or not ok; any other method there is the listener's 404."""

from __future__ import annotations

import httpx

from agentd.telemetry.health import Health, use_health
from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
from tests.transport.served import JSON, EchoHandler, served


async def test_probes_answer_without_the_bearer_and_say_only_ok_or_not() -> None:
    app = McpAsgiApp(EchoHandler(), AsgiOptions(bearer="needed-for-mcp"))
    health = Health(mode="daemon")
    with use_health(health):
        async with served(app) as s, httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.port}") as client:
            assert (await client.post("/mcp", headers=JSON, content=b"{}")).status_code == 401
            live = await client.get("/healthz", headers={"host": "evil.example"})  # no gate at all
            assert (live.status_code, live.text, live.headers["content-type"]) == (200, "ok\n", "text/plain")
            assert (await client.head("/healthz")).status_code == 200
            not_ready = await client.get("/readyz")
            assert (not_ready.status_code, not_ready.text) == (503, "not ready\n")
            health.started = True
            ready = await client.get("/readyz")
            assert (ready.status_code, ready.text) == (200, "ok\n")
            for method in ("POST", "PUT", "DELETE"):
                other = await client.request(method, "/healthz")
                assert (other.status_code, other.text) == (404, "not found")


async def test_outside_a_daemon_ready_means_answering() -> None:
    async with served(McpAsgiApp(EchoHandler())) as s, httpx.AsyncClient() as client:
        for path in ("/healthz", "/readyz"):
            assert (await client.get(f"http://127.0.0.1:{s.port}{path}")).text == "ok\n"
