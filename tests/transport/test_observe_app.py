"""agentd.transport.observe_app (``--metrics-addr``) through the real server: ``/metrics`` (behind the bearer
when one is set), the probes without it, 404 elsewhere, and GET/HEAD only on every path."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from agentd.telemetry import metrics
from agentd.transport.observe_app import ObserveApp
from tests.transport.served import served


@pytest.fixture(autouse=True)
def enabled_metrics() -> Iterator[None]:
    metrics.enable()
    yield
    metrics.disable()


async def test_metrics_behind_the_bearer_probes_without_it() -> None:
    async with served(ObserveApp("metrics-bearer")) as s, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.port}") as client:
        refused = await client.get("/metrics")
        assert (refused.status_code, refused.headers["www-authenticate"]) == (401, "Bearer")
        assert (await client.get("/metrics", headers={"authorization": "Bearer wrong"})).status_code == 401
        exposed = await client.get("/metrics", headers={"authorization": "Bearer metrics-bearer"})
        assert exposed.status_code == 200 and exposed.headers["content-type"].startswith("text/plain")
        assert "# TYPE" in exposed.text
        assert (await client.get("/healthz")).text == "ok\n"
        assert (await client.get("/readyz")).status_code == 200
        missing = await client.get("/mcp")
        assert (missing.status_code, missing.text) == (404, "not found\n")
        for path in ("/metrics", "/healthz", "/nowhere"):
            wrong = await client.post(path)
            assert (wrong.status_code, wrong.text) == (405, "method not allowed\n")


async def test_a_loopback_metrics_port_without_a_bearer_needs_none() -> None:
    async with served(ObserveApp(None)) as s, httpx.AsyncClient() as client:
        assert (await client.get(f"http://127.0.0.1:{s.port}/metrics")).status_code == 200
