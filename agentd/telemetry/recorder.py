"""The one mapping from the metrics facade's calls to the declared instruments, shared by both backends.

:mod:`agentd.telemetry.metrics` normalises a call's values and hands them to each sink; a backend
(the Prometheus registry, the OTLP instruments) derives from :class:`Recorder` and supplies only
:meth:`Recorder.record`, so which instrument a call moves, and with which label values in which order, is
written once, against the declarations of :mod:`agentd.telemetry.schema`.
"""

from __future__ import annotations

from agentd.telemetry import schema
from agentd.telemetry.schema import Instrument


class Recorder:
    """The one mapping from the facade's calls to the declared instruments (:mod:`agentd.telemetry.schema`).

    A backend supplies :meth:`record` (add to a counter or up-down counter, set a gauge, observe a
    histogram, each on the series named by the label values in declared order).
    """

    def record(self, instrument: Instrument, value: float, labels: tuple[str, ...] = ()) -> None:
        raise NotImplementedError

    def run_ended(self, status: str, depth: str) -> None:
        self.record(schema.RUNS, 1, (status, depth))

    def step(self, input_tokens: int, output_tokens: int, depth: str) -> None:
        self.record(schema.STEPS, 1, (depth,))
        self.record(schema.TOKENS, input_tokens, ("input", depth))
        self.record(schema.TOKENS, output_tokens, ("output", depth))

    def cost(self, usd: float, depth: str) -> None:
        self.record(schema.COST, usd, (depth,))

    def tool_call(self, server: str, outcome: str, depth: str) -> None:
        self.record(schema.TOOL_CALLS, 1, (server, outcome, depth))

    def mcp_request(self, method: str, server: str, seconds: float, error_type: str) -> None:
        self.record(schema.MCP_DURATION, seconds, (method, server, error_type))

    def gateway_call(self, seconds: float, outcome: str) -> None:
        self.record(schema.GATEWAY_DURATION, seconds, (outcome,))

    def failover(self) -> None:
        self.record(schema.FAILOVERS, 1)

    def breaker(self, endpoint: str, value: int) -> None:
        self.record(schema.BREAKER, value, (endpoint,))

    def subagents_live(self, depth: str, count: int) -> None:
        self.record(schema.SUBAGENTS_LIVE, count, (depth,))

    def spawn_refused(self, cap: str) -> None:
        self.record(schema.SPAWN_REFUSALS, 1, (cap,))

    def woke(self, coalesced: int) -> None:
        self.record(schema.WAKES, 1)
        if coalesced:
            self.record(schema.COALESCED, coalesced)

    def served_session(self, delta: int) -> None:
        self.record(schema.SERVED_SESSIONS, delta)

    def served_request(self, outcome: str) -> None:
        self.record(schema.SERVED_REQUESTS, 1, (outcome,))

    def journal_commit(self, seconds: float) -> None:
        self.record(schema.JOURNAL_LAG, seconds)

    def journal_queue(self, delta: int) -> None:
        self.record(schema.JOURNAL_QUEUE, delta)

    def cluster_capacity(self, member_free_slots: int, members: int, free_slots: int, queued: int, oldest_age: float) -> None:
        self.record(schema.CLUSTER_MEMBER_FREE, member_free_slots)
        self.record(schema.CLUSTER_MEMBERS, members)
        self.record(schema.CLUSTER_FREE, free_slots)
        self.record(schema.CLUSTER_QUEUED, queued)
        self.record(schema.CLUSTER_OLDEST, oldest_age)
