"""OTLP metrics: the declared instruments (agentd/telemetry/schema.py) in OpenTelemetry, imported only with ``--otel``.

The instruments live in an SDK meter provider of agentd's own (the global one stays untouched). Names
and attributes follow the GenAI and MCP conventions where they have one (``gen_ai.client.token.usage``,
``gen_ai.client.operation.duration``, ``mcp.client.operation.duration``, ``process.memory.usage``) and
agentd's own names elsewhere, all declared in agentd/telemetry/schema.py beside the Prometheus ones.

Export is the OTLP exporter package's protobuf encoding POSTed with httpx from a trio task, every
``OTEL_METRIC_EXPORT_INTERVAL`` and once more, bounded, at exit: the SDK's periodic reader and OTLP/HTTP
exporter would run a thread with blocking I/O, and agentd does its network I/O on trio (as the span
exporter does). Temporality is cumulative, so a lost export loses nothing but freshness.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import trio
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from agentd._version import __version__
from agentd.telemetry import schema
from agentd.telemetry.recorder import Recorder
from agentd.telemetry.schema import Instrument
from agentd.telemetry.settings import OtelSettings


def _rss(options: CallbackOptions) -> Iterable[Observation]:
    """Resident set size from /proc (Linux; nothing elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return []
    return [Observation(pages * os.sysconf("SC_PAGE_SIZE"))]


class OtelMetrics(Recorder):
    """A :class:`agentd.telemetry.metrics.Sink` that exports OTLP, with every declared instrument."""

    def __init__(self, settings: OtelSettings) -> None:
        self.settings = settings
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader],
                                      resource=Resource.create(settings.resource_attributes(os.getpid())))
        meter = self.provider.get_meter("agentd", __version__)
        self.instruments: dict[Instrument, Any] = {}
        for inst in schema.RECORDED:
            kind = inst.otlp_kind
            if kind == "histogram":
                made: Any = meter.create_histogram(inst.otel, inst.unit, inst.description,
                                                   explicit_bucket_boundaries_advisory=inst.buckets)
            elif kind == "counter":
                made = meter.create_counter(inst.otel, inst.unit, inst.description)
            elif kind == "updown":
                made = meter.create_up_down_counter(inst.otel, inst.unit, inst.description)
            else:
                made = meter.create_gauge(inst.otel, inst.unit, inst.description)
            self.instruments[inst] = made
        memory = schema.PROCESS_MEMORY
        meter.create_observable_up_down_counter(memory.otel, [_rss], memory.unit, memory.description)
        self.exported = 0
        self.failed = 0

    def record(self, instrument: Instrument, value: float, labels: tuple[str, ...] = ()) -> None:
        attributes = dict(instrument.otel_constants)
        for label, label_value in zip(instrument.labels, labels, strict=True):
            if label_value != label.omit:
                attributes[label.otel] = label_value
        made = self.instruments[instrument]
        kind = instrument.otlp_kind
        if kind == "histogram":
            made.record(value, attributes)
        elif kind == "gauge":
            made.set(value, attributes)
        else:
            made.add(value, attributes)

    # -- export --------------------------------------------------------------------------------------

    async def flush(self, timeout: float) -> None:
        data = self.reader.get_metrics_data()
        if data is None or not data.resource_metrics:
            return
        import httpx
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

        body = encode_metrics(data).SerializeToString()
        headers = {**self.settings.metrics_headers, "content-type": "application/x-protobuf"}
        verify: Any = self.settings.certificate or True
        with trio.move_on_after(timeout) as scope:
            try:
                async with httpx.AsyncClient(timeout=self.settings.export_timeout, verify=verify) as client:
                    response = await client.post(self.settings.metrics_endpoint, content=body, headers=headers)
            except httpx.HTTPError:
                self.failed += 1
                return
            if response.status_code // 100 == 2:
                self.exported += 1
            else:
                self.failed += 1
        if scope.cancelled_caught:
            self.failed += 1

    async def run_exporter(self) -> None:
        while True:
            await trio.sleep(self.settings.metric_interval)
            await self.flush(self.settings.export_timeout)
