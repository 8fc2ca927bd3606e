"""Metrics with a fixed schema and bounded labels, behind a facade that is free when off.

Off by default. Every part of agentd records through the functions below; each passes the (normalised)
values to the process's sinks, and with none enabled it is one global read of an empty tuple. Sinks:

- :class:`Metrics`, the Prometheus registry (``--metrics-addr``; ``prometheus_client`` imported then);
- :class:`agentd.telemetry.otel_metrics.OtelMetrics`, the same schema as OTLP metrics (``--otel``);
- :class:`Deltas` in a subagent process: its observations wait there until the child sends them up the
  control channel (``metrics`` frames, with its pongs and before its results) and the root replays them
  with the child's depth (:func:`merge`), so the root's metrics count the whole tree.

Label values come from closed sets (statuses, outcomes, caps, MCP methods agentd sends) or from
configuration (declared server names, gateway endpoints), and the few open ones (an error type, a
server name a child reports) are capped in number, so the number of series stays bounded.

The series themselves are declared once, in :mod:`agentd.telemetry.schema`: both backends are built from
that table, one :class:`agentd.telemetry.recorder.Recorder` maps each call below to its instruments, and
docs/observability.md's table is generated from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, Protocol

from agentd.deferred.patterns import Pattern
from agentd.telemetry import schema
from agentd.telemetry.recorder import Recorder
from agentd.telemetry.schema import (
    CAPS,
    GATEWAY_DURATION_BUCKETS,
    JOURNAL_LAG_BUCKETS,
    MCP_DURATION_BUCKETS,
    SERVED_OUTCOMES,
    TOKEN_BUCKETS,
    TOOL_OUTCOMES,
    Instrument,
)

if TYPE_CHECKING:
    from agentd.telemetry.otel_metrics import OtelMetrics
    from agentd.telemetry.settings import OtelSettings

#: Breaker states as gauge values.
BREAKER_VALUES: Final = {"closed": 0, "half_open": 1, "open": 2}
#: The MCP methods agentd's client sends; any other method is counted as ``other``.
MCP_METHODS: Final = frozenset({
    "initialize", "server/discover", "ping", "tools/list", "tools/call", "resources/list", "resources/read",
    "resources/templates/list", "resources/subscribe", "resources/unsubscribe", "subscriptions/listen",
    "prompts/list", "prompts/get",
})
#: Distinct values an open label (an error type, a server a child names) may take; more are ``other``.
MAX_OPEN_VALUES: Final = 64
#: Observations a subagent keeps for its parent (more are dropped and counted) and sends per frame.
MAX_PENDING: Final = 4096
MAX_PER_FRAME: Final = 256
#: What a run status looks like (agentd.agent.result.RunStatus values: ``completed``, ``exhausted_steps``, …).
_STATUS: Final = Pattern(r"[a-z][a-z_]{0,31}")
#: The depth label of this process's own runs (the root's handle ``0``).
OWN_DEPTH: Final = "0"


class Sink(Protocol):
    """What a metrics backend records (values already normalised by the facade)."""

    def run_ended(self, status: str, depth: str) -> None: ...
    def step(self, input_tokens: int, output_tokens: int, depth: str) -> None: ...
    def cost(self, usd: float, depth: str) -> None: ...
    def tool_call(self, server: str, outcome: str, depth: str) -> None: ...
    def mcp_request(self, method: str, server: str, seconds: float, error_type: str) -> None: ...
    def gateway_call(self, seconds: float, outcome: str) -> None: ...
    def failover(self) -> None: ...
    def breaker(self, endpoint: str, value: int) -> None: ...
    def subagents_live(self, depth: str, count: int) -> None: ...
    def spawn_refused(self, cap: str) -> None: ...
    def woke(self, coalesced: int) -> None: ...
    def served_session(self, delta: int) -> None: ...
    def served_request(self, outcome: str) -> None: ...
    def journal_commit(self, seconds: float) -> None: ...
    def journal_queue(self, delta: int) -> None: ...
    def cluster_capacity(self, member_free_slots: int, members: int, free_slots: int, queued: int, oldest_age: float) -> None: ...


class Metrics(Recorder):
    """The Prometheus registry with every declared series (built only when metrics are enabled)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        from prometheus_client.process_collector import ProcessCollector

        self.registry = registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=registry)  # schema.PROCESS_MEMORY: process_resident_memory_bytes and friends (Linux)
        self.series: dict[Instrument, Any] = {}
        for inst in schema.RECORDED:
            names = [label.prom for label in inst.labels]
            if inst.kind == "histogram":
                made: Any = Histogram(inst.prom, inst.description, names, buckets=inst.buckets, registry=registry)
            else:
                made = (Counter if inst.kind == "counter" else Gauge)(inst.prom, inst.description, names,
                                                                     registry=registry)
            self.series[inst] = made

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def record(self, instrument: Instrument, value: float, labels: tuple[str, ...] = ()) -> None:
        series = self.series[instrument]
        if labels:
            series = series.labels(*labels)
        if instrument.kind == "histogram":
            series.observe(value)
        elif instrument.kind == "gauge":
            series.set(value)
        else:
            series.inc(value)


class Deltas:
    """A subagent's sink: what its runs did, kept (bounded) until the child sends it up the channel.

    Each observation is a small JSON list (``["step", 10, 5]``, ``["tool", "fix", "result"]``, …) that the
    root replays with :func:`merge`. Only the per-run series travel; breaker states, wakes, served requests
    and the journal are the root process's own, and live subagents and refusals are counted at the root.
    """

    def __init__(self) -> None:
        self.pending: list[list[Any]] = []
        self.dropped = 0

    def _add(self, item: list[Any]) -> None:
        if len(self.pending) >= MAX_PENDING:
            self.dropped += 1
        else:
            self.pending.append(item)

    def take(self, limit: int = MAX_PER_FRAME) -> list[list[Any]]:
        taken, self.pending = self.pending[:limit], self.pending[limit:]
        return taken

    def run_ended(self, status: str, depth: str) -> None:
        self._add(["run", status])

    def step(self, input_tokens: int, output_tokens: int, depth: str) -> None:
        self._add(["step", input_tokens, output_tokens])

    def cost(self, usd: float, depth: str) -> None:
        self._add(["cost", usd])

    def tool_call(self, server: str, outcome: str, depth: str) -> None:
        self._add(["tool", server, outcome])

    def mcp_request(self, method: str, server: str, seconds: float, error_type: str) -> None:
        self._add(["mcp", method, server, round(seconds, 6), error_type])

    def gateway_call(self, seconds: float, outcome: str) -> None:
        self._add(["gateway", round(seconds, 6), outcome])

    def failover(self) -> None:
        self._add(["failover"])

    def breaker(self, endpoint: str, value: int) -> None:
        return None

    def subagents_live(self, depth: str, count: int) -> None:
        return None

    def spawn_refused(self, cap: str) -> None:
        return None

    def woke(self, coalesced: int) -> None:
        return None

    def served_session(self, delta: int) -> None:
        return None

    def served_request(self, outcome: str) -> None:
        return None

    def journal_commit(self, seconds: float) -> None:
        return None

    def journal_queue(self, delta: int) -> None:
        return None

    def cluster_capacity(self, member_free_slots: int, members: int, free_slots: int, queued: int, oldest_age: float) -> None:
        return None


#: The sinks of this process; empty while metrics are off (the fast path reads this one global).
_sinks: tuple[Sink, ...] = ()
_prometheus: Metrics | None = None
_otel: OtelMetrics | None = None
_deltas: Deltas | None = None
_depths: set[str] = set()
#: Values seen per open label (bounded by :data:`MAX_OPEN_VALUES`).
_open: dict[str, set[str]] = {}


def _install() -> None:
    global _sinks
    _sinks = tuple(s for s in (_prometheus, _otel, _deltas) if s is not None)


def enable() -> Metrics:
    """The Prometheus registry (``--metrics-addr``); idempotent."""
    global _prometheus
    if _prometheus is None:
        _prometheus = Metrics()
        _install()
    return _prometheus


def enable_otel(settings: OtelSettings) -> OtelMetrics:
    """OTLP metrics (``--otel``): imports the OpenTelemetry metrics SDK; idempotent (the first settings win)."""
    global _otel
    if _otel is None:
        from agentd.telemetry.otel_metrics import OtelMetrics

        _otel = OtelMetrics(settings)
        _install()
    return _otel


def collect_deltas() -> Deltas:
    """In a subagent process: keep observations for the parent (the root has metrics on)."""
    global _deltas
    if _deltas is None:
        _deltas = Deltas()
        _install()
    return _deltas


def disable() -> None:
    """Every sink off (tests)."""
    global _prometheus, _otel, _deltas
    _prometheus = _otel = _deltas = None
    _depths.clear()
    _open.clear()
    _install()


def enabled() -> bool:
    """Does this process record metrics (for itself, or to hand to its parent)?"""
    return bool(_sinks)


def current() -> Metrics | None:
    return _prometheus


def deltas() -> Deltas | None:
    return _deltas


def _bounded(label: str, value: str) -> str:
    seen = _open.setdefault(label, set())
    if value in seen:
        return value
    if len(seen) >= MAX_OPEN_VALUES:
        return "other"
    seen.add(value)
    return value


# --- recording (each a no-op while metrics are off) ----------------------------------------------------------


def run_ended(status: str, depth: str = OWN_DEPTH) -> None:
    for sink in _sinks:
        sink.run_ended(status, depth)


def step(input_tokens: int, output_tokens: int, depth: str = OWN_DEPTH, *, cost: int | None = None) -> None:
    """One model call's tokens, and what it cost in picodollars when the run is priced (agentd.prices)."""
    if not _sinks:
        return
    for sink in _sinks:
        sink.step(max(0, input_tokens), max(0, output_tokens), depth)
    if cost is not None and cost > 0:
        spent(cost / 10**12, depth)


def spent(usd: float, depth: str = OWN_DEPTH) -> None:
    """US dollars the tree's model calls cost (a float is fine here: a metric, not the budget's books)."""
    for sink in _sinks:
        sink.cost(usd, depth)


def tool_call(server: str | None, outcome: str, depth: str = OWN_DEPTH) -> None:
    for sink in _sinks:
        sink.tool_call(server or "agentd", outcome, depth)


def mcp_request(method: str, server: str, seconds: float, error_type: str = "") -> None:
    if _sinks:
        method = method if method in MCP_METHODS else "other"
        error_type = _bounded("error_type", error_type[:64]) if error_type else ""
        for sink in _sinks:
            sink.mcp_request(method, server, seconds, error_type)


def gateway_call(seconds: float, outcome: str) -> None:
    for sink in _sinks:
        sink.gateway_call(seconds, outcome)


def failover() -> None:
    for sink in _sinks:
        sink.failover()


def breaker(endpoint: str, state: str) -> None:
    for sink in _sinks:
        sink.breaker(endpoint, BREAKER_VALUES.get(state, 0))


def subagents_live(handles: Iterable[str]) -> None:
    """Set the live-by-depth gauge from the chokepoint's live handles (depth = dots in the handle)."""
    if not _sinks:
        return
    counts: dict[str, int] = {}
    for handle in handles:
        depth = str(handle.count("."))
        counts[depth] = counts.get(depth, 0) + 1
    for depth in _depths | set(counts):
        for sink in _sinks:
            sink.subagents_live(depth, counts.get(depth, 0))
    _depths.update(counts)


def spawn_refused(cap: str) -> None:
    """A refused spawn; ``cap`` is the refusal's ``cap`` (anything outside :data:`CAPS` counts as ``other``)."""
    for sink in _sinks:
        sink.spawn_refused(cap if cap in CAPS else "other")


def woke(updates: int) -> None:
    """One wake that folded ``updates`` resource updates (all but the first were coalesced into it)."""
    for sink in _sinks:
        sink.woke(max(0, updates - 1))


def served_session(delta: int) -> None:
    for sink in _sinks:
        sink.served_session(delta)


def served_request(outcome: str) -> None:
    for sink in _sinks:
        sink.served_request(outcome if outcome in SERVED_OUTCOMES else "error")


def journal_commit(seconds: float) -> None:
    """One journal commit of a step's records, ``seconds`` after the step ended."""
    for sink in _sinks:
        sink.journal_commit(seconds)


def journal_queue(delta: int) -> None:
    for sink in _sinks:
        sink.journal_queue(delta)


def cluster_capacity(member_free_slots: int, members: int, free_slots: int, queued: int,
                     oldest_queued_age: float | None) -> None:
    """A cluster member's capacity signal, set on its heartbeat's cadence (gauges: the last read wins)."""
    for sink in _sinks:
        sink.cluster_capacity(member_free_slots, members, free_slots, queued, oldest_queued_age or 0.0)


# --- a subtree's observations, replayed at the root ------------------------------------------------------


def merge(depth: int, observations: Iterable[Any]) -> int:
    """Replay a subagent's observations (:class:`Deltas`) with its ``depth``; returns how many were taken.

    The items come from another process: each is checked against the schema and a malformed one is
    skipped. A nested child's frames pass through its parent unchanged (their depth is their own).
    """
    if not _sinks or not 0 < depth <= 64:
        return 0
    label = str(depth)
    taken = 0
    for item in observations:
        if not isinstance(item, list) or not item or not isinstance(item[0], str):
            continue
        kind, args = item[0], item[1:]
        if kind == "step" and _ints(args, 2):
            step(args[0], args[1], label)
        elif kind == "cost" and len(args) == 1 and isinstance(args[0], int | float) \
                and not isinstance(args[0], bool) and 0 < args[0] < 10**6:
            spent(float(args[0]), label)
        elif kind == "run" and _strs(args, 1):
            run_ended(_bounded("status", args[0]) if _STATUS.fullmatch(args[0]) else "other", label)
        elif kind == "tool" and _strs(args, 2):
            tool_call(_bounded("server", args[0][:128]), args[1] if args[1] in TOOL_OUTCOMES else "other", label)
        elif kind == "mcp" and len(args) == 4 and _strs(args[:2] + args[3:], 3) and _seconds(args[2]):
            mcp_request(args[0], _bounded("server", args[1][:128]), float(args[2]), args[3])
        elif kind == "gateway" and len(args) == 2 and _seconds(args[0]) and isinstance(args[1], str):
            gateway_call(float(args[0]), "ok" if args[1] == "ok" else "error")
        elif kind == "failover" and not args:
            failover()
        else:
            continue
        taken += 1
    return taken


def _ints(args: list[Any], n: int) -> bool:
    return len(args) == n and all(isinstance(a, int) and not isinstance(a, bool) and 0 <= a < 2 ** 53 for a in args)


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 86400.0


def _strs(args: list[Any], n: int) -> bool:
    return len(args) == n and all(isinstance(a, str) for a in args)


# --- OTLP export ----------------------------------------------------------------------------------------------


async def run_exporter() -> None:
    """Export OTLP metrics periodically until cancelled (nothing to do unless :func:`enable_otel` ran)."""
    otel = _otel
    if otel is not None:
        await otel.run_exporter()


async def flush(timeout: float) -> None:
    """Export the OTLP metrics now, for at most ``timeout`` seconds (failures are counted, never raised)."""
    otel = _otel
    if otel is not None:
        await otel.flush(timeout)


def otel_enabled() -> bool:
    return _otel is not None


__all__: Final[Any] = ("GATEWAY_DURATION_BUCKETS", "JOURNAL_LAG_BUCKETS", "MCP_DURATION_BUCKETS", "TOKEN_BUCKETS",
                       "Deltas", "Metrics", "Recorder", "Sink", "current", "disable", "enable", "enable_otel", "merge")
