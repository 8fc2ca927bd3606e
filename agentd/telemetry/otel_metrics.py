"""OTLP metrics: the Prometheus schema as OpenTelemetry instruments, imported only with ``--otel``.

The instruments live in an SDK meter provider of agentd's own (the global one stays untouched). Names
and attributes follow the GenAI and MCP conventions where they have one (``gen_ai.client.token.usage``,
``gen_ai.client.operation.duration``, ``mcp.client.operation.duration``, ``process.memory.usage``) and
agentd's own names elsewhere (agentd/telemetry/names.py).

Export is the OTLP exporter package's protobuf encoding POSTed with httpx from a trio task, every
``OTEL_METRIC_EXPORT_INTERVAL`` and once more, bounded, at exit: the SDK's periodic reader and OTLP/HTTP
exporter would run a thread with blocking I/O, and agentd does its network I/O on trio (as the span
exporter does). Temporality is cumulative, so a lost export loses nothing but freshness.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Final

import trio
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from agentd._version import __version__
from agentd.telemetry import names
from agentd.telemetry.settings import OtelSettings

_CHAT: Final = {names.GEN_AI_OPERATION_NAME: names.OP_CHAT, names.GEN_AI_PROVIDER_NAME: names.PROVIDER_OPENAI}


def _rss(options: CallbackOptions) -> Iterable[Observation]:
    """Resident set size from /proc (Linux; nothing elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return []
    return [Observation(pages * os.sysconf("SC_PAGE_SIZE"))]


class OtelMetrics:
    """A :class:`agentd.telemetry.metrics.Sink` that exports OTLP."""

    def __init__(self, settings: OtelSettings) -> None:
        self.settings = settings
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader],
                                      resource=Resource.create(settings.resource_attributes(os.getpid())))
        meter = self.provider.get_meter("agentd", __version__)
        self.runs = meter.create_counter(names.METRIC_RUNS, "{run}", "Agent-loop runs of the tree")
        self.steps = meter.create_counter(names.METRIC_STEPS, "{step}", "Loop steps (model calls) of the tree")
        self.cost_usd = meter.create_counter(names.METRIC_COST, "USD", "What the tree's model calls cost (priced runs)")
        self.tokens = meter.create_histogram(names.METRIC_TOKEN_USAGE, "{token}", "Tokens per model call",
                                             explicit_bucket_boundaries_advisory=names.TOKEN_BUCKETS)
        self.tool_calls = meter.create_counter(names.METRIC_TOOL_CALLS, "{call}", "Tool calls the model asked for")
        self.mcp_duration = meter.create_histogram(
            names.METRIC_MCP_DURATION, "s", "Duration of MCP requests the tree sent",
            explicit_bucket_boundaries_advisory=names.MCP_DURATION_BUCKETS)
        self.gateway_duration = meter.create_histogram(
            names.METRIC_OPERATION_DURATION, "s", "Duration of model calls, failover included",
            explicit_bucket_boundaries_advisory=names.GATEWAY_DURATION_BUCKETS)
        self.failovers = meter.create_counter(names.METRIC_FAILOVERS, "{call}", "Model calls that failed over")
        self.breakers = meter.create_gauge(names.METRIC_BREAKER, "1", "Endpoint breaker: 0 closed, 1 half-open, 2 open")
        self.live = meter.create_gauge(names.METRIC_SUBAGENTS_LIVE, "{subagent}", "Live subagents by depth")
        self.refusals = meter.create_counter(names.METRIC_SPAWN_REFUSALS, "{spawn}", "Spawns refused, by cap")
        self.wakes = meter.create_counter(names.METRIC_WAKES, "{wake}", "Reactive wakes")
        self.coalesced = meter.create_counter(names.METRIC_COALESCED, "{update}", "Updates merged into a wake")
        self.sessions = meter.create_up_down_counter(names.METRIC_SERVED_SESSIONS, "{session}",
                                                     "Open self-MCP sessions")
        self.served = meter.create_counter(names.METRIC_SERVED_REQUESTS, "{request}", "Self-MCP requests")
        self.journal_lag = meter.create_histogram(
            names.METRIC_JOURNAL_LAG, "s", "Time from a step's end to its journal commit",
            explicit_bucket_boundaries_advisory=names.JOURNAL_LAG_BUCKETS)
        self.journal_pending = meter.create_up_down_counter(names.METRIC_JOURNAL_QUEUE, "{commit}",
                                                            "Journal commits waiting or in progress")
        self.cluster_member_free = meter.create_gauge(names.METRIC_CLUSTER_MEMBER_FREE, "{slot}",
                                                      "This member's free slots")
        self.cluster_members = meter.create_gauge(names.METRIC_CLUSTER_MEMBERS, "{member}", "Live cluster members")
        self.cluster_free = meter.create_gauge(names.METRIC_CLUSTER_FREE, "{slot}", "Free slots of all live members")
        self.cluster_queued = meter.create_gauge(names.METRIC_CLUSTER_QUEUED, "{item}", "Unclaimed cluster work")
        self.cluster_oldest = meter.create_gauge(names.METRIC_CLUSTER_OLDEST, "s",
                                                 "Age of the oldest unclaimed cluster work item")
        meter.create_observable_up_down_counter(names.METRIC_PROCESS_MEMORY, [_rss], "By",
                                                "Resident memory of the process")  # as the convention has it
        self.exported = 0
        self.failed = 0

    # -- Sink ----------------------------------------------------------------------------------------

    def run_ended(self, status: str, depth: str) -> None:
        self.runs.add(1, {names.AGENTD_RUN_STATUS: status, names.AGENTD_DEPTH: depth})

    def step(self, input_tokens: int, output_tokens: int, depth: str) -> None:
        self.steps.add(1, {names.AGENTD_DEPTH: depth})
        self.tokens.record(input_tokens, {**_CHAT, names.GEN_AI_TOKEN_TYPE: "input", names.AGENTD_DEPTH: depth})
        self.tokens.record(output_tokens, {**_CHAT, names.GEN_AI_TOKEN_TYPE: "output", names.AGENTD_DEPTH: depth})

    def cost(self, usd: float, depth: str) -> None:
        self.cost_usd.add(usd, {names.AGENTD_DEPTH: depth})

    def tool_call(self, server: str, outcome: str, depth: str) -> None:
        self.tool_calls.add(1, {names.AGENTD_SERVER: server, names.AGENTD_OUTCOME: outcome,
                                names.AGENTD_DEPTH: depth})

    def mcp_request(self, method: str, server: str, seconds: float, error_type: str) -> None:
        attributes = {names.MCP_METHOD_NAME: method, names.AGENTD_SERVER: server}
        if error_type:
            attributes[names.ERROR_TYPE] = error_type
        self.mcp_duration.record(seconds, attributes)

    def gateway_call(self, seconds: float, outcome: str) -> None:
        self.gateway_duration.record(seconds, _CHAT if outcome == "ok" else {**_CHAT, names.ERROR_TYPE: outcome})

    def failover(self) -> None:
        self.failovers.add(1)

    def breaker(self, endpoint: str, value: int) -> None:
        self.breakers.set(value, {names.AGENTD_ENDPOINT: endpoint})

    def subagents_live(self, depth: str, count: int) -> None:
        self.live.set(count, {names.AGENTD_DEPTH: depth})

    def spawn_refused(self, cap: str) -> None:
        self.refusals.add(1, {names.AGENTD_CAP: cap})

    def woke(self, coalesced: int) -> None:
        self.wakes.add(1)
        if coalesced:
            self.coalesced.add(coalesced)

    def served_session(self, delta: int) -> None:
        self.sessions.add(delta)

    def served_request(self, outcome: str) -> None:
        self.served.add(1, {names.AGENTD_OUTCOME: outcome})

    def journal_commit(self, seconds: float) -> None:
        self.journal_lag.record(seconds)

    def journal_queue(self, delta: int) -> None:
        self.journal_pending.add(delta)

    def cluster_capacity(self, member_free_slots: int, members: int, free_slots: int, queued: int, oldest_age: float) -> None:
        self.cluster_member_free.set(member_free_slots)
        self.cluster_members.set(members)
        self.cluster_free.set(free_slots)
        self.cluster_queued.set(queued)
        self.cluster_oldest.set(oldest_age)

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
