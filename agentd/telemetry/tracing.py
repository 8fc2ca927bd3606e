"""The OpenTelemetry side of :mod:`agentd.telemetry`: imported only by :func:`agentd.telemetry.enable`.

It owns a tracer provider of its own (the global one stays untouched, so a host that embeds agentd keeps
its own), W3C trace-context propagation, and an exporter that runs on trio: ended spans wait in a bounded
queue (full: the newest are dropped and counted) and are POSTed as OTLP/HTTP protobuf, encoded by the
OTLP exporter package's encoder, from a trio task with httpx. The SDK's batch processor would start a
thread per process for that; agentd does its network I/O on trio.

Exception messages never reach a span (they can hold content); a failed span gets ``error.type``.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

import trio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentd._version import __version__
from agentd.telemetry import names
from agentd.telemetry.settings import OtelSettings

_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER}


class _Queue(SpanProcessor):
    """Ended, sampled spans waiting for export; bounded."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spans: deque[ReadableSpan] = deque()
        self.dropped = 0
        self.wakeup: trio.Event | None = None
        self.batch = limit

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        if len(self.spans) >= self.limit:
            self.dropped += 1
            return
        self.spans.append(span)
        if self.wakeup is not None and len(self.spans) >= self.batch:
            self.wakeup.set()

    def shutdown(self) -> None:
        self.spans.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class Tracing:
    def __init__(self, settings: OtelSettings) -> None:
        self.settings = settings
        resource = Resource.create(settings.resource_attributes(os.getpid()))
        self.provider = TracerProvider(resource=resource)
        self.queue = _Queue(settings.max_queue)
        self.queue.batch = settings.max_batch
        self.provider.add_span_processor(self.queue)
        self.tracer = self.provider.get_tracer("agentd", __version__)
        self.propagator = TraceContextTextMapPropagator()
        self.exported = 0
        self.failed = 0

    # -- spans -------------------------------------------------------------------------------------------

    @contextmanager
    def span(self, name: str, kind: str, attributes: Mapping[str, Any] | None) -> Iterator[Any]:
        span = self.tracer.start_span(name, kind=_KINDS[kind], attributes=attributes,
                                      record_exception=False, set_status_on_exception=False)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield span
        except BaseException as exc:
            if span.is_recording():
                self.mark_error(span, _error_type(exc))
            raise
        finally:
            otel_context.detach(token)
            span.end()

    def start_span(self, name: str, kind: str, attributes: Mapping[str, Any] | None) -> Any:
        return self.tracer.start_span(name, kind=_KINDS[kind], attributes=attributes,
                                      record_exception=False, set_status_on_exception=False)

    def current_span(self) -> Any:
        return trace.get_current_span()

    def mark_error(self, span: Any, error_type: str) -> None:
        span.set_attribute(names.ERROR_TYPE, error_type)
        span.set_status(Status(StatusCode.ERROR))

    # -- propagation -------------------------------------------------------------------------------------

    def inject(self, carrier: MutableMapping[str, Any]) -> None:
        self.propagator.inject(carrier)

    def context_of(self, span: Any) -> dict[str, str]:
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    @contextmanager
    def remote_parent(self, carrier: Mapping[str, Any]) -> Iterator[None]:
        fields = {k: v for k, v in carrier.items() if k in (names.TRACEPARENT, names.TRACESTATE)
                  and isinstance(v, str)}
        token = otel_context.attach(self.propagator.extract(fields))
        try:
            yield
        finally:
            otel_context.detach(token)

    def log_ids(self) -> dict[str, str] | None:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}

    # -- export ------------------------------------------------------------------------------------------

    async def flush(self, timeout: float) -> None:
        if not self.queue.spans:
            return
        import httpx
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        headers = {**self.settings.headers, "content-type": "application/x-protobuf"}
        verify: Any = self.settings.certificate or True
        with trio.move_on_after(timeout):
            async with httpx.AsyncClient(timeout=self.settings.export_timeout, verify=verify) as client:
                while self.queue.spans:
                    batch = [self.queue.spans.popleft()
                             for _ in range(min(self.settings.max_batch, len(self.queue.spans)))]
                    body = encode_spans(batch).SerializeToString()
                    try:
                        response = await client.post(self.settings.traces_endpoint, content=body, headers=headers)
                    except httpx.HTTPError:
                        self.failed += len(batch)
                        continue
                    except BaseException:
                        # Cut off (the exporter cancelled at the end of the run, a flush out of time): the batch
                        # goes back first in line, for the final flush, not lost with the task that popped it.
                        self.queue.spans.extendleft(reversed(batch))
                        raise
                    if response.status_code // 100 == 2:
                        self.exported += len(batch)
                    else:
                        self.failed += len(batch)

    async def run_exporter(self) -> None:
        while True:
            self.queue.wakeup = trio.Event()
            with trio.move_on_after(self.settings.schedule_delay):
                await self.queue.wakeup.wait()
            await self.flush(self.settings.export_timeout)


def _error_type(exc: BaseException) -> str:
    if isinstance(exc, trio.Cancelled):
        return "cancelled"
    return type(exc).__qualname__
