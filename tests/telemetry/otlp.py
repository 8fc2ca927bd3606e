"""An in-process OTLP/HTTP receiver: ``POST /v1/traces`` and ``/v1/metrics`` bodies decoded with
opentelemetry-proto.

Served by hypercorn on 127.0.0.1 in the test's own trio run; every received span is flattened to a
:class:`ReceivedSpan` (ids as hex, attributes as plain values, the service name of its resource), and every
metrics export to a list of :class:`ReceivedPoint`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.peers.asgi import Receive, Send, lifespan, read_body


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


@attrs.frozen
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    status_code: int
    resource: dict[str, Any]

    @property
    def pid(self) -> Any:
        return self.resource.get("process.pid")


@attrs.frozen
class ReceivedPoint:
    """One data point: ``value`` is a sum's or gauge's value, or a histogram's sum (``count`` and
    ``bounds``/``buckets`` then too)."""

    name: str
    unit: str
    kind: str
    attributes: dict[str, Any]
    value: float
    resource: dict[str, Any]
    count: int = 0
    bounds: tuple[float, ...] = ()
    buckets: tuple[int, ...] = ()


def _points(request: ExportMetricsServiceRequest) -> list[ReceivedPoint]:
    out = []
    for resource_metrics in request.resource_metrics:
        resource = {kv.key: _value(kv.value) for kv in resource_metrics.resource.attributes}
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    attributes = {kv.key: _value(kv.value) for kv in point.attributes}
                    if kind == "histogram":
                        out.append(ReceivedPoint(metric.name, metric.unit, kind, attributes, point.sum, resource,
                                                 point.count, tuple(point.explicit_bounds),
                                                 tuple(point.bucket_counts)))
                    else:
                        value = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
                        out.append(ReceivedPoint(metric.name, metric.unit, kind, attributes, value, resource))
    return out


@attrs.define(eq=False)
class Receiver:
    spans: list[ReceivedSpan] = attrs.field(factory=list)
    #: Each metrics export, as its points (cumulative: the last export holds the totals).
    metric_exports: list[list[ReceivedPoint]] = attrs.field(factory=list)
    bodies: list[bytes] = attrs.field(factory=list)
    headers: list[dict[str, str]] = attrs.field(factory=list)
    url: str = ""

    def named(self, prefix: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name.startswith(prefix)]

    def by_id(self) -> dict[str, ReceivedSpan]:
        return {s.span_id: s for s in self.spans}

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if scope["method"] == "POST" and scope["path"] == "/v1/metrics":
            self.headers.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
            self.bodies.append(body)
            metrics_request = ExportMetricsServiceRequest()
            metrics_request.ParseFromString(body)
            self.metric_exports.append(_points(metrics_request))
            await _answer(send, 200, ExportMetricsServiceResponse().SerializeToString())
            return
        if scope["method"] != "POST" or scope["path"] != "/v1/traces":
            await _answer(send, 404, b"")
            return
        self.headers.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
        self.bodies.append(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(ReceivedSpan(
                        name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(), kind=span.kind,
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        status_code=span.status.code, resource=resource,
                    ))
        await _answer(send, 200, ExportTraceServiceResponse().SerializeToString())


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/x-protobuf")]})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.loglevel = "WARNING"
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, receiver, config))  # type: ignore[arg-type]
        receiver.url = binds[0]
        yield receiver
        nursery.cancel_scope.cancel()
