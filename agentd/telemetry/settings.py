"""Where spans go and how they are batched: the standard ``OTEL_*`` environment variables, read once.

The root reads them from its environment; a subagent gets the same values in its run payload (its
environment is an allowlist, and ``OTEL_EXPORTER_OTLP_HEADERS`` may hold a credential, which travels like
the other secrets: over the control channel, never in argv or env).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any, Final

import attrs

DEFAULT_ENDPOINT: Final = "http://localhost:4318"
TRACES_PATH: Final = "/v1/traces"
METRICS_PATH: Final = "/v1/metrics"
DEFAULT_SERVICE_NAME: Final = "agentd"
#: OTEL_BSP_* defaults from the specification (ms and counts).
DEFAULT_SCHEDULE_DELAY_MS: Final = 5000
DEFAULT_MAX_QUEUE: Final = 2048
DEFAULT_MAX_BATCH: Final = 512
DEFAULT_EXPORT_TIMEOUT_MS: Final = 10000
#: OTEL_METRIC_EXPORT_INTERVAL's default from the specification (ms).
DEFAULT_METRIC_INTERVAL_MS: Final = 60000


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        value = int(env.get(name, "").strip())
    except ValueError:
        return default
    return value if value > 0 else default


def _pairs(text: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` (values URL-encoded), as OTEL_EXPORTER_OTLP_HEADERS and OTEL_RESOURCE_ATTRIBUTES."""
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return out


def sdk_disabled(env: Mapping[str, str]) -> bool:
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


@attrs.frozen
class OtelSettings:
    traces_endpoint: str = DEFAULT_ENDPOINT + TRACES_PATH
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    service_name: str = DEFAULT_SERVICE_NAME
    resource: Mapping[str, str] = attrs.field(factory=dict)
    schedule_delay: float = DEFAULT_SCHEDULE_DELAY_MS / 1000
    max_queue: int = DEFAULT_MAX_QUEUE
    max_batch: int = DEFAULT_MAX_BATCH
    export_timeout: float = DEFAULT_EXPORT_TIMEOUT_MS / 1000
    #: A CA bundle for an https collector (OTEL_EXPORTER_OTLP_CERTIFICATE).
    certificate: str | None = None
    log_content: bool = False
    #: OTLP metrics: on unless OTEL_METRICS_EXPORTER=none; where, with which headers, how often.
    metrics: bool = True
    metrics_endpoint: str = DEFAULT_ENDPOINT + METRICS_PATH
    metrics_headers: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    metric_interval: float = DEFAULT_METRIC_INTERVAL_MS / 1000

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, log_content: bool = False) -> OtelSettings:
        base = (env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or DEFAULT_ENDPOINT).rstrip("/")
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip() or base + TRACES_PATH
        metrics_endpoint = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "").strip() or base + METRICS_PATH
        common = _pairs(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
        headers = {**common, **_pairs(env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS", ""))}
        metrics_headers = {**common, **_pairs(env.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS", ""))}
        resource = _pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
        service = env.get("OTEL_SERVICE_NAME", "").strip() or resource.get("service.name") or DEFAULT_SERVICE_NAME
        return cls(
            traces_endpoint=endpoint,
            headers=headers,
            service_name=service,
            resource=resource,
            schedule_delay=_int(env, "OTEL_BSP_SCHEDULE_DELAY", DEFAULT_SCHEDULE_DELAY_MS) / 1000,
            max_queue=_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_MAX_QUEUE),
            max_batch=_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_MAX_BATCH),
            export_timeout=_int(env, "OTEL_EXPORTER_OTLP_TIMEOUT", DEFAULT_EXPORT_TIMEOUT_MS) / 1000,
            certificate=env.get("OTEL_EXPORTER_OTLP_CERTIFICATE") or None,
            log_content=log_content,
            metrics=env.get("OTEL_METRICS_EXPORTER", "").strip().lower() != "none",
            metrics_endpoint=metrics_endpoint,
            metrics_headers=metrics_headers,
            metric_interval=_int(env, "OTEL_METRIC_EXPORT_INTERVAL", DEFAULT_METRIC_INTERVAL_MS) / 1000,
        )

    def resource_attributes(self, pid: int) -> dict[str, Any]:
        """The resource every span and metric of this process carries."""
        from agentd._version import __version__

        return {**self.resource, "service.name": self.service_name, "service.version": __version__,
                "process.pid": pid}

    def to_wire(self) -> dict[str, Any]:
        """For a subagent, which traces but leaves metrics to the root: no metrics credentials."""
        wire = attrs.asdict(self)
        del wire["metrics_headers"]
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> OtelSettings:
        names = {f.name for f in attrs.fields(cls)}
        return cls(**{k: v for k, v in wire.items() if k in names})
