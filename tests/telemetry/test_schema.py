"""The metrics schema is declared once (agentd/telemetry/schema.py): the Prometheus scrape and the OTLP export
carry exactly the declared series, with the declared kinds, units and labels, and docs/observability.md's table
is the declaration's rendering.

Every facade call is made once, both backends on, and what each wire carries is read back the way a scraper
or a collector reads it (prometheus_client's text parser; OTLP protobuf decoded with opentelemetry-proto).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from agentd.telemetry import metrics, schema
from agentd.telemetry.settings import OtelSettings
from tests.telemetry.otlp import otlp_receiver

ROOT = Path(__file__).resolve().parents[2]
#: What the facade's calls below put on each labelled series (one value per declared label).
_PROM_TYPES = {"counter": "counter", "gauge": "gauge", "updown": "gauge", "histogram": "histogram"}
_OTLP_KINDS = {"counter": "sum", "gauge": "gauge", "updown": "sum", "histogram": "histogram"}


@pytest.fixture(autouse=True)
def metrics_off_afterwards():
    metrics.disable()
    yield
    metrics.disable()


def _every_call() -> None:
    """Each facade function once, failing outcomes included (so optional OTLP attributes appear too)."""
    metrics.run_ended("completed")
    metrics.step(10, 5, cost=2_500_000_000)  # picodollars: 0.0025 USD
    metrics.tool_call("fs", "result")
    metrics.mcp_request("tools/call", "fs", 0.01, "tool_error")
    metrics.gateway_call(0.2, "error")
    metrics.failover()
    metrics.breaker("https://gw.example/v1", "open")
    metrics.subagents_live(["0.1"])
    metrics.spawn_refused("max_depth")
    metrics.woke(3)
    metrics.served_session(1)
    metrics.served_request("ok")
    metrics.journal_commit(0.002)
    metrics.journal_queue(1)
    metrics.cluster_capacity(1, 2, 3, 4, 5.0)


def test_the_prometheus_scrape_carries_exactly_the_declared_series() -> None:
    registry = metrics.enable()
    _every_call()
    body, _ = registry.exposition()
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    declared = {inst.prom for inst in schema.RECORDED}
    created = {name + "_created" for name in declared}  # prometheus_client's creation timestamps
    ours = {name for name in families if not name.startswith(("process_", "python_")) and name not in created}
    assert ours == declared
    assert schema.PROCESS_MEMORY.prom in families
    for inst in schema.RECORDED:
        family = families[inst.prom]
        assert family.type == _PROM_TYPES[inst.kind], inst.prom
        assert family.documentation == inst.description
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket")):
                continue
            assert set(sample.labels) == {label.prom for label in inst.labels}, sample
        if inst.kind == "counter":
            assert any(sample.name == inst.exposed for sample in family.samples)
        if inst.kind == "histogram":
            bounds = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
            assert tuple(sorted(set(bounds)))[:-1] == inst.buckets  # and +Inf


async def test_the_otlp_export_carries_exactly_the_declared_instruments() -> None:
    async with otlp_receiver() as receiver:
        metrics.enable_otel(OtelSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}))
        _every_call()
        with trio.fail_after(30):
            await metrics.flush(10)
    points = receiver.metric_exports[-1]
    assert {p.name for p in points} == {inst.otel for inst in schema.INSTRUMENTS}
    for inst in schema.INSTRUMENTS:
        mine = [p for p in points if p.name == inst.otel]
        for point in mine:
            assert (point.kind, point.unit) == (_OTLP_KINDS[inst.otlp_kind], inst.unit), inst.otel
            if inst is not schema.PROCESS_MEMORY:
                declared = {label.otel for label in inst.labels} | {key for key, _ in inst.otel_constants}
                assert set(point.attributes) == declared, (inst.otel, point.attributes)
                assert dict(inst.otel_constants).items() <= point.attributes.items()
            if inst.buckets and inst.otlp_kind == "histogram":
                assert point.bounds == inst.buckets


async def test_an_attribute_declared_absent_for_one_value_is_left_out_of_the_otlp_point() -> None:
    async with otlp_receiver() as receiver:
        metrics.enable_otel(OtelSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}))
        metrics.gateway_call(0.2, "ok")
        metrics.mcp_request("tools/call", "fs", 0.01)
        with trio.fail_after(30):
            await metrics.flush(10)
    points = {p.name: p for p in receiver.metric_exports[-1]}
    assert "error.type" not in points[schema.GATEWAY_DURATION.otel].attributes
    assert points[schema.MCP_DURATION.otel].attributes == {"mcp.method.name": "tools/call", "agentd.mcp.server": "fs"}


def test_every_instrument_is_declared_once() -> None:
    assert len({inst.prom for inst in schema.INSTRUMENTS}) == len(schema.INSTRUMENTS)
    assert len({inst.otel for inst in schema.INSTRUMENTS}) == len(schema.INSTRUMENTS)


def test_the_docs_metrics_table_is_generated_from_the_declarations() -> None:
    proc = subprocess.run([sys.executable, "scripts/gen_metrics_docs.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = (ROOT / "docs" / "observability.md").read_text()
    assert schema.docs_table() in doc
