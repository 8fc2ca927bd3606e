"""Prometheus metrics with a fixed schema and bounded labels, behind a facade that is free when off.

Off by default: nothing imports ``prometheus_client`` until :func:`enable` (``--metrics-addr``). While off,
each recording function is one global read. Label values come from closed sets (statuses, outcomes,
caps, MCP methods agentd sends) or from configuration (declared server names, gateway endpoints), never
from a peer, so the number of series stays bounded. docs/observability.md lists the schema.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

#: ``mcp.client.operation.duration`` bucket boundaries from the MCP semantic conventions (seconds).
MCP_DURATION_BUCKETS: Final = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: ``gen_ai.client.operation.duration`` bucket boundaries from the GenAI semantic conventions (seconds).
GATEWAY_DURATION_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                                   40.96, 81.92)
#: Breaker states as gauge values.
BREAKER_VALUES: Final = {"closed": 0, "half_open": 1, "open": 2}
#: The caps a spawn refusal can name (anything else is ``other``).
CAPS: Final = ("max_depth", "max_children", "max_subagents", "token_ceiling", "spawn_rate", "draining", "tool_scope",
               "caller")
#: Served request outcomes.
SERVED_OUTCOMES: Final = ("ok", "error", "tool_error", "refused")
#: The MCP methods agentd's client sends; any other method is counted as ``other``.
MCP_METHODS: Final = frozenset({
    "initialize", "server/discover", "ping", "tools/list", "tools/call", "resources/list", "resources/read",
    "resources/templates/list", "resources/subscribe", "resources/unsubscribe", "subscriptions/listen",
    "prompts/list", "prompts/get",
})


class Metrics:
    """The registry and every series agentd exports (built only when metrics are enabled)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        from prometheus_client.process_collector import ProcessCollector

        self.registry = registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends (Linux)
        self.runs = Counter("agentd_runs", "Agent-loop runs in this process, by final status",
                            ["status"], registry=registry)
        self.steps = Counter("agentd_steps", "Loop steps (model calls) in this process", registry=registry)
        self.tokens = Counter("agentd_tokens", "Model tokens used by this process's runs, by kind",
                              ["kind"], registry=registry)
        self.tool_calls = Counter("agentd_tool_calls", "Tool calls by server (agentd = control tools) and outcome",
                                  ["server", "outcome"], registry=registry)
        self.mcp_duration = Histogram(
            "mcp_client_operation_duration_seconds", "Duration of MCP requests agentd sent",
            ["mcp_method_name", "server", "error_type"], buckets=MCP_DURATION_BUCKETS, registry=registry)
        self.gateway_duration = Histogram(
            "agentd_gateway_request_duration_seconds", "Duration of model calls, failover included, by outcome",
            ["outcome"], buckets=GATEWAY_DURATION_BUCKETS, registry=registry)
        self.failovers = Counter("agentd_gateway_failovers", "Model calls that moved on to the next endpoint",
                                 registry=registry)
        self.breaker = Gauge("agentd_gateway_breaker_state", "Endpoint breaker: 0 closed, 1 half-open, 2 open",
                             ["endpoint"], registry=registry)
        self.live = Gauge("agentd_subagents_live", "Live subagents of the whole tree by depth (root process)",
                          ["depth"], registry=registry)
        self.refusals = Counter("agentd_spawn_refusals", "Spawns refused at the chokepoint, by cap",
                                ["cap"], registry=registry)
        self.wakes = Counter("agentd_wakes", "Reactive wakes (runs started by an update, a timer or a cron)",
                             registry=registry)
        self.coalesced = Counter("agentd_coalesced_updates", "Resource updates merged into a pending wake",
                                 registry=registry)
        self.sessions = Gauge("agentd_served_sessions", "Open self-MCP sessions", registry=registry)
        self.served = Counter("agentd_served_requests", "Self-MCP requests by outcome", ["outcome"],
                              registry=registry)
        self._depths: set[str] = set()

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


_metrics: Metrics | None = None


def enable() -> Metrics:
    global _metrics
    if _metrics is None:
        _metrics = Metrics()
    return _metrics


def disable() -> None:
    global _metrics
    _metrics = None


def current() -> Metrics | None:
    return _metrics


# --- recording (each a no-op while metrics are off) ----------------------------------------------------------


def run_ended(status: str) -> None:
    if _metrics is not None:
        _metrics.runs.labels(status).inc()


def step(input_tokens: int, output_tokens: int) -> None:
    if _metrics is not None:
        _metrics.steps.inc()
        _metrics.tokens.labels("input").inc(max(0, input_tokens))
        _metrics.tokens.labels("output").inc(max(0, output_tokens))


def tool_call(server: str | None, outcome: str) -> None:
    if _metrics is not None:
        _metrics.tool_calls.labels(server or "agentd", outcome).inc()


def mcp_request(method: str, server: str, seconds: float, error_type: str = "") -> None:
    if _metrics is not None:
        _metrics.mcp_duration.labels(method if method in MCP_METHODS else "other", server,
                                     error_type).observe(seconds)


def gateway_call(seconds: float, outcome: str) -> None:
    if _metrics is not None:
        _metrics.gateway_duration.labels(outcome).observe(seconds)


def failover() -> None:
    if _metrics is not None:
        _metrics.failovers.inc()


def breaker(endpoint: str, state: str) -> None:
    if _metrics is not None:
        _metrics.breaker.labels(endpoint).set(BREAKER_VALUES.get(state, 0))


def subagents_live(handles: Iterable[str]) -> None:
    """Set the live-by-depth gauge from the chokepoint's live handles (depth = dots in the handle)."""
    if _metrics is None:
        return
    counts: dict[str, int] = {}
    for handle in handles:
        depth = str(handle.count("."))
        counts[depth] = counts.get(depth, 0) + 1
    for depth in _metrics._depths | set(counts):
        _metrics.live.labels(depth).set(counts.get(depth, 0))
    _metrics._depths |= set(counts)


def spawn_refused(cap: str) -> None:
    """A refused spawn; ``cap`` is the refusal's ``cap`` (anything outside :data:`CAPS` counts as ``other``)."""
    if _metrics is not None:
        _metrics.refusals.labels(cap if cap in CAPS else "other").inc()


def woke(updates: int) -> None:
    """One wake that folded ``updates`` resource updates (all but the first were coalesced into it)."""
    if _metrics is not None:
        _metrics.wakes.inc()
        if updates > 1:
            _metrics.coalesced.inc(updates - 1)


def served_session(delta: int) -> None:
    if _metrics is not None:
        _metrics.sessions.inc(delta)


def served_request(outcome: str) -> None:
    if _metrics is not None:
        _metrics.served.labels(outcome if outcome in SERVED_OUTCOMES else "error").inc()


__all__: Final[Any] = ("Metrics", "current", "disable", "enable")
