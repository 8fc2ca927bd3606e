"""``--metrics-addr``, ``--health-file`` and the probes, through a real daemon run in this trio process.

The run has known counts (two model steps that call tools, one ok and one ``isError``, then a final
answer); the daemon also serves its self-MCP, so it stays up after the run until the drain latch fires,
and ``/metrics`` is scraped over HTTP and parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from agentd.config.load import load_config
from agentd.daemon import main
from agentd.errors import ConfigError
from agentd.oversight.drain import DrainLatch, use_drain
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from tests.client.fakeserver import Req, Resp, mcp_answer, result, serve_fake
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.waiting import until


async def _mcp(req: Req, resp: Resp) -> None:
    if req.rpc_method == "tools/list":
        await resp.json(result(req, {"tools": [{"name": "ok", "inputSchema": {"type": "object"}},
                                               {"name": "bad", "inputSchema": {"type": "object"}}]}))
    elif req.rpc_method == "tools/call":
        bad = req.json["params"]["name"] == "bad"
        await resp.json(result(req, {"content": [{"type": "text", "text": "no" if bad else "yes"}], "isError": bad}))
    else:
        await mcp_answer(req, resp)


def _samples(text_body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text_body):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.fixture
def fresh_metrics():
    metrics.disable()
    yield
    metrics.disable()


async def test_metrics_health_file_and_probes_after_a_run_with_known_counts(tmp_path: Path, fresh_metrics):
    events: list[dict[str, Any]] = []
    health_file = tmp_path / "health.json"
    usage = {"prompt_tokens": 10, "completion_tokens": 5}
    async with scripted_gateway([tool_call("fix__ok", {}, usage=usage), tool_call("fix__bad", {}, usage=usage),
                                 text("done", usage=usage)]) as gw, trio.open_nursery() as nursery:
        mcp = await nursery.start(serve_fake, _mcp)
        cfg = load_config(["--instruction", "go", "--intelligence", gw.url, "--mcp", f"fix={mcp.url}",
                                "--serve-mcp", "http://127.0.0.1:0/mcp", "--metrics-addr", "127.0.0.1:0",
                                "--health-file", str(health_file)], env={})
        latch = DrainLatch()
        ended = trio.Event()

        async def daemon() -> None:
            with use_drain(latch):
                await main(cfg, log=EventLog(sink=events.append), env={})
            ended.set()

        nursery.start_soon(daemon)
        await until(lambda: any(e["event"] == "run.end" for e in events), timeout=30, what="run.end")
        def both_started() -> list[dict[str, Any]] | None:
            starts = [e for e in events if e["event"] == "serve.start"]
            return starts if len(starts) >= 2 else None

        starts = await until(both_started, timeout=30, what="both serve.start")
        metrics_url = next(e for e in starts if e["comp"] == "metrics")["urls"][0]
        serve_url = next(e for e in starts if e["comp"] != "metrics")["urls"][0]
        async with httpx.AsyncClient() as client:
            scraped = await client.get(metrics_url)  # serve.start advertises the endpoint, path included
            assert scraped.status_code == 200
            samples = _samples(scraped.text)
            base = serve_url.split("/mcp")[0].rstrip("/")
            health = await client.get(base + "/healthz")
            ready = await client.get(base + "/readyz")
            metrics_ready = await client.get(metrics_url.removesuffix("/metrics") + "/readyz")
        assert (health.status_code, health.text) == (200, "ok\n")
        assert (ready.status_code, ready.text) == (200, "ok\n")
        assert metrics_ready.status_code == 200
        # rewritten about every second: the first write may predate readiness
        def ready() -> dict[str, Any] | None:
            doc = json.loads(health_file.read_text())
            return doc if doc["ready"] else None

        doc = await until(ready, timeout=10, what="health.json ready")
        assert doc["alive"] is True and doc["ready"] is True and doc["draining"] is False
        assert doc["mode"] == "once" and doc["supervisor_tick_age_ms"] < 5000
        latch.request("test")
        with trio.fail_after(30):
            await ended.wait()
        mcp.stop()
    assert samples[("agentd_runs_total", (("depth", "0"), ("status", "completed")))] == 1
    assert samples[("agentd_steps_total", (("depth", "0"),))] == 3
    assert samples[("agentd_tokens_total", (("depth", "0"), ("kind", "input")))] == 30
    assert samples[("agentd_tokens_total", (("depth", "0"), ("kind", "output")))] == 15
    assert samples[("agentd_tool_calls_total", (("depth", "0"), ("outcome", "result"), ("server", "fix")))] == 1
    assert samples[("agentd_tool_calls_total", (("depth", "0"), ("outcome", "tool_error"), ("server", "fix")))] == 1
    calls = (("error_type", ""), ("mcp_method_name", "tools/call"), ("server", "fix"))
    assert samples[("mcp_client_operation_duration_seconds_count", calls)] == 1
    errors = (("error_type", "tool_error"), ("mcp_method_name", "tools/call"), ("server", "fix"))
    assert samples[("mcp_client_operation_duration_seconds_count", errors)] == 1
    assert samples[("agentd_gateway_request_duration_seconds_count", (("outcome", "ok"),))] == 3
    assert samples[("process_resident_memory_bytes", ())] > 0
    # the convention's bucket boundaries
    buckets = {dict(labels).get("le") for (name, labels) in samples if name.endswith("duration_seconds_bucket")
               and dict(labels).get("mcp_method_name") == "tools/call"}
    assert {"0.01", "0.02", "0.05", "300.0", "+Inf"} <= buckets
    after = json.loads(health_file.read_text())
    assert after["alive"] is False and after["ready"] is False


def test_a_non_loopback_metrics_listener_needs_the_serve_auth() -> None:
    with pytest.raises(ConfigError, match="non-loopback"):
        load_config(["--instruction", "x", "--intelligence", "test", "--metrics-addr", "0.0.0.0:9464"], env={})
    with pytest.raises(ConfigError, match="HOST:PORT"):
        load_config(["--instruction", "x", "--intelligence", "test", "--metrics-addr", "nope"], env={})


def test_traceparent_is_checked_and_read_from_the_standard_variable() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    cfg = load_config(["--instruction", "x", "--intelligence", "test"], env={"TRACEPARENT": good})
    assert cfg.telemetry.traceparent == good
    with pytest.raises(ConfigError, match="traceparent"):
        load_config(["--instruction", "x", "--intelligence", "test", "--traceparent", "00-xyz"], env={})


def test_the_telemetry_section_of_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "agentd.yaml"
    path.write_text("telemetry:\n  otel: true\n  metrics_addr: 127.0.0.1:9464\n  log_level: debug\n")
    cfg = load_config(["--config", str(path), "--instruction", "x", "--intelligence", "test"], env={})
    assert (cfg.telemetry.otel, cfg.telemetry.metrics_addr, cfg.telemetry.log_level) == (True, "127.0.0.1:9464", "debug")
    path.write_text("telemetry:\n  mode: loop\n")
    with pytest.raises(ConfigError, match=r"\$\.telemetry\.mode"):
        load_config(["--config", str(path), "--instruction", "x", "--intelligence", "test"], env={})


async def test_loopback_metrics_stay_plain_and_open_when_the_mcp_listener_uses_tls_and_a_bearer(tmp_path: Path) -> None:
    """docs/observability.md: a loopback ``--metrics-addr`` needs no authentication, whatever the MCP
    listener uses; the MCP listener itself still wants its TLS and its token."""
    from tests.integration.agents import agentd_worker
    from tests.selfmcp.certs import make_pki

    pki = make_pki(tmp_path / "pki")
    argv = ["--intelligence", "test", "--serve-mcp", "https://127.0.0.1:0/mcp", "--serve-cert",
            str(pki.server.cert), "--serve-key", str(pki.server.key), "--serve-bearer", "{{secret:METRICS_T}}",
            "--metrics-addr", "127.0.0.1:0", "--log-format", "json"]
    with trio.fail_after(90):
        async with agentd_worker(argv, env={"METRICS_T": "m" * 40}) as worker:
            started = await worker.wait_event(lambda e: e.get("event") == "serve.start" and e.get("comp") == "metrics")
            url = started["urls"][0]
            assert url.startswith("http://127.0.0.1:")
            async with httpx.AsyncClient() as client:
                metrics = await client.get(url)
                assert metrics.status_code == 200 and "agentd_" in metrics.text
            async with httpx.AsyncClient(verify=str(pki.ca)) as client:
                served = await worker.wait_event(lambda e: e.get("event") == "serve.start" and e.get("comp") != "metrics")
                assert served["urls"][0].startswith("https://")
                refused = await client.post(served["urls"][0], json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                assert refused.status_code == 401
