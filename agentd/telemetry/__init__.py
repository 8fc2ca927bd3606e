"""Tracing for agentd behind a facade that costs next to nothing when it is off.

Tracing is off by default. While it is off, nothing from OpenTelemetry is imported: :func:`span` returns
one shared no-op object, :func:`inject` leaves the carrier alone and :func:`log_ids` answers None after
one global read. :func:`enable` (``--otel``) loads :mod:`agentd.telemetry.tracing`, which owns the SDK's
tracer provider and an exporter that runs on trio (no exporter thread).

Every part of agentd traces through these functions, so call sites never test whether tracing is on.

Trio and spans: OpenTelemetry keeps the current span in a contextvar, and a trio task starts with a copy
of its spawner's context, so a span opened with ``with span(...)`` is the parent of whatever the same
task, or a task it starts, does inside the block. A span must be opened and closed in one task; a span
that outlives the task that started it (one the supervisor owns across tasks) is started with
:func:`start_span` and ended explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, cast

if TYPE_CHECKING:
    from agentd.telemetry.settings import OtelSettings
    from agentd.telemetry.tracing import Tracing

SpanKind = Literal["internal", "client", "server"]


class Span(Protocol):
    """What call sites may do with a span (a subset of the OpenTelemetry span API)."""

    def set_attribute(self, key: str, value: Any) -> None: ...

    def is_recording(self) -> bool: ...

    def end(self) -> None: ...


class _NoopSpan:
    """The span of a process that does not trace: also its own context manager."""

    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def is_recording(self) -> bool:
        return False

    def end(self) -> None:
        return None

    def __enter__(self) -> _NoopSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NOOP: Final = _NoopSpan()

#: The process's tracing backend; None while tracing is off (the fast path tests this one global).
_tracing: Tracing | None = None


def enabled() -> bool:
    return _tracing is not None


def content_allowed() -> bool:
    """May spans carry prompt and argument content (``--log-content``)?"""
    return _tracing is not None and _tracing.settings.log_content


def enable(settings: OtelSettings) -> None:
    """Turn tracing on for this process (idempotent: the first settings win). Imports the SDK."""
    global _tracing
    if _tracing is None:
        from agentd.telemetry.tracing import Tracing

        _tracing = Tracing(settings)


def disable() -> None:
    """Turn tracing off again (tests; spans not yet exported are dropped)."""
    global _tracing
    _tracing = None


def span(name: str, *, kind: SpanKind = "internal",
         attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Span]:
    """A span that is current for the ``with`` block, in this task."""
    tracing = _tracing
    if tracing is None:
        return NOOP
    return tracing.span(name, kind, attributes)


def start_span(name: str, *, kind: SpanKind = "internal", attributes: Mapping[str, Any] | None = None) -> Span:
    """A span that is *not* made current: the caller ends it, from whichever task (child of the current span)."""
    tracing = _tracing
    if tracing is None:
        return NOOP
    return cast(Span, tracing.start_span(name, kind, attributes))


def current_span() -> Span:
    tracing = _tracing
    if tracing is None:
        return NOOP
    return cast(Span, tracing.current_span())


def mark_error(span: Span, error_type: str) -> None:
    """``error.type`` on the span and its status set to error (no message: it could hold content)."""
    if _tracing is not None and span.is_recording():
        _tracing.mark_error(span, error_type)


def inject(carrier: MutableMapping[str, Any]) -> None:
    """Write the current span's W3C ``traceparent`` (and ``tracestate``) into ``carrier``."""
    tracing = _tracing
    if tracing is not None:
        tracing.inject(carrier)


def context_of(span: Span) -> dict[str, str]:
    """The W3C trace context naming ``span`` as the parent (empty when tracing is off)."""
    tracing = _tracing
    if tracing is None:
        return {}
    return tracing.context_of(span)


#: Reusable: entering it does nothing.
_NOTHING: Final[AbstractContextManager[None]] = nullcontext()


def remote_parent(carrier: Mapping[str, Any] | None) -> AbstractContextManager[None]:
    """Make the trace context in ``carrier`` (``traceparent``/``tracestate``) the parent of the spans this
    task opens inside the block. A missing or malformed ``traceparent`` changes nothing."""
    tracing = _tracing
    if tracing is None or not carrier or not isinstance(carrier.get("traceparent"), str):
        return _NOTHING
    return tracing.remote_parent(carrier)


def log_ids() -> dict[str, str] | None:
    """``{"trace_id", "span_id"}`` of the current span for a JSON line, or None."""
    tracing = _tracing
    if tracing is None:
        return None
    return tracing.log_ids()


async def flush(timeout: float = 5.0) -> None:
    """Export the spans ended so far (bounded by ``timeout``; failures are counted, never raised)."""
    tracing = _tracing
    if tracing is not None:
        await tracing.flush(timeout)


async def run_exporter() -> None:
    """Export ended spans periodically until cancelled (run it in a nursery that outlives the work)."""
    tracing = _tracing
    if tracing is not None:
        await tracing.run_exporter()


def child_settings() -> dict[str, Any] | None:
    """The settings a subagent needs to trace into the same backend (JSON), or None when off."""
    tracing = _tracing
    if tracing is None:
        return None
    return tracing.settings.to_wire()


__all__ = [
    "NOOP",
    "Span",
    "SpanKind",
    "child_settings",
    "content_allowed",
    "context_of",
    "current_span",
    "disable",
    "enable",
    "enabled",
    "flush",
    "inject",
    "log_ids",
    "mark_error",
    "remote_parent",
    "run_exporter",
    "span",
    "start_span",
]
