"""Every metric agentd exports, declared once: name, kind, unit, description and labels of each instrument.

Both backends are built from this table (the Prometheus registry in :mod:`agentd.telemetry.metrics`, the
OTLP instruments in :mod:`agentd.telemetry.otel_metrics`), and so is the metrics table in
docs/observability.md (``scripts/gen_metrics_docs.py``), so a series is named in one place. The two wire
formats differ where their conventions do, and the declaration says how: an OTLP name, unit and attribute
key beside each Prometheus name and label; a different kind on either side (tokens are a Prometheus counter
and an OTLP histogram, as the GenAI convention has it); OTLP attributes that are constant (``chat``,
``openai``) or left out for one value (``error.type`` when the call succeeded).

Plain data, no import but the attribute keys of agentd.telemetry.names: the facade loads it at a once
run's start-up, metrics on or off.
"""

from __future__ import annotations

from typing import Final, Literal

from agentd.telemetry import names

#: ``updown`` is recorded as deltas: an OTLP up-down counter, a Prometheus gauge moved by ``inc``.
Kind = Literal["counter", "gauge", "updown", "histogram"]

#: ``mcp.client.operation.duration`` bucket boundaries from the MCP semantic conventions (seconds).
MCP_DURATION_BUCKETS: Final = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: ``gen_ai.client.operation.duration`` bucket boundaries from the GenAI semantic conventions (seconds).
GATEWAY_DURATION_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                                   40.96, 81.92)
#: ``gen_ai.client.token.usage`` bucket boundaries from the GenAI conventions (1 … 4**13, powers of 4).
TOKEN_BUCKETS: Final = tuple(float(4 ** n) for n in range(14))
#: Journal commit lag buckets (seconds), agentd's own: a local SQLite commit is ~ms, a shared store's tens of ms.
JOURNAL_LAG_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

#: The caps a spawn refusal can name (anything else is ``other``).
CAPS: Final = ("max_depth", "max_children", "max_subagents", "token_ceiling", "spawn_rate", "draining", "tool_scope",
               "caller", "budget_usd", "model")
#: Served request outcomes.
SERVED_OUTCOMES: Final = ("ok", "error", "tool_error", "refused")
#: Tool call outcomes.
TOOL_OUTCOMES: Final = ("result", "tool_error", "rejected", "fault")
#: What the GenAI convention puts on every chat metric (OTLP only).
CHAT_ATTRIBUTES: Final = ((names.GEN_AI_OPERATION_NAME, names.OP_CHAT), (names.GEN_AI_PROVIDER_NAME, names.PROVIDER_OPENAI))


def _values(*values: str) -> str:
    return ", ".join(f"`{value}`" for value in values)


class Label:
    """One label: its Prometheus name, its OTLP attribute key, and what values it takes (for the docs).

    (Plain classes with slots, never changed after construction: this module loads at a once run's start-up,
    where two attrs classes cost a millisecond and a half of CPU; identity is their equality and hash.)
    """

    __slots__ = ("omit", "otel", "prom", "values")

    def __init__(self, prom: str, otel: str, values: str = "", omit: str | None = None) -> None:
        self.prom = prom
        self.otel = otel
        self.values = values
        #: The value for which OTLP leaves the attribute out (``error.type`` is absent on success).
        self.omit = omit


class Instrument:
    """One series family on both wires. ``prom`` is the Prometheus name without the ``_total`` a counter gets."""

    __slots__ = ("buckets", "description", "doc", "exposed", "kind", "labels", "otel", "otel_constants",
                 "otlp_kind", "prom", "unit")

    def __init__(self, prom: str, otel: str, kind: Kind, unit: str, description: str, labels: tuple[Label, ...] = (),
                 *, otel_kind: Kind | None = None, buckets: tuple[float, ...] = (),
                 otel_constants: tuple[tuple[str, str], ...] = (), doc: str = "") -> None:
        self.prom = prom
        self.otel = otel
        self.kind = kind
        self.unit = unit
        self.description = description
        self.labels = labels
        #: The OTLP kind (``kind`` unless the conventions choose another).
        self.otlp_kind: Kind = otel_kind or kind
        self.buckets = buckets
        #: Fixed OTLP attributes on every point.
        self.otel_constants = otel_constants
        #: What the docs add to the description (label values, when the series exists).
        self.doc = doc
        #: The name a Prometheus scrape shows.
        self.exposed = prom + "_total" if kind == "counter" else prom

    def __repr__(self) -> str:
        return f"Instrument({self.prom!r}, {self.otel!r})"


DEPTH: Final = Label("depth", "agentd.agent.depth", "`0` the root process's own, `1` its children, …")
SERVER: Final = Label("server", names.AGENTD_SERVER, "declared server name; `agentd` for control tools")

RUNS: Final = Instrument(
    "agentd_runs", "agentd.runs", "counter", "{run}", "Agent-loop runs of the tree, by final status and depth",
    (Label("status", names.AGENTD_RUN_STATUS, "`completed`, `exhausted_steps`, `mcp_failed`, …"), DEPTH))
STEPS: Final = Instrument("agentd_steps", "agentd.steps", "counter", "{step}",
                          "Loop steps (model calls) of the tree, by depth", (DEPTH,))
TOKENS: Final = Instrument(
    "agentd_tokens", "gen_ai.client.token.usage", "counter", "{token}",
    "Model tokens used by the tree's runs, by kind and depth",
    (Label("kind", "gen_ai.token.type", "`input`, `output`"), DEPTH), otel_kind="histogram", buckets=TOKEN_BUCKETS,
    otel_constants=CHAT_ATTRIBUTES, doc="OTLP has one observation per model call, buckets from the GenAI convention "
                                        "(1 … 67108864, powers of 4)")
COST: Final = Instrument(
    "agentd_cost_usd", "agentd.cost", "counter", "USD", "What the tree's model calls cost in US dollars (priced runs), "
    "by depth", (DEPTH,), doc="priced runs only (`--price`); each reply at the price of the model that made it; a "
                              "float here, the budget's books are integers")
TOOL_CALLS: Final = Instrument(
    "agentd_tool_calls", "agentd.tool.calls", "counter", "{call}",
    "Tool calls by server (agentd = control tools), outcome and depth",
    (SERVER, Label("outcome", "agentd.outcome", _values(*TOOL_OUTCOMES)), DEPTH))
MCP_DURATION: Final = Instrument(
    "mcp_client_operation_duration_seconds", "mcp.client.operation.duration", "histogram", "s",
    "Duration of MCP requests the tree sent",
    (Label("mcp_method_name", names.MCP_METHOD_NAME, "the MCP methods agentd sends, else `other`"), SERVER,
     Label("error_type", names.ERROR_TYPE, "empty (OTLP: absent) when it succeeded", omit="")),
    buckets=MCP_DURATION_BUCKETS, doc="buckets from the MCP convention (0.01 … 300 s)")
GATEWAY_DURATION: Final = Instrument(
    "agentd_gateway_request_duration_seconds", "gen_ai.client.operation.duration", "histogram", "s",
    "Duration of model calls, failover included, by outcome",
    (Label("outcome", names.ERROR_TYPE, "`ok` (OTLP: absent), `error`", omit="ok"),), buckets=GATEWAY_DURATION_BUCKETS,
    otel_constants=CHAT_ATTRIBUTES, doc="retries included; buckets from the GenAI convention")
FAILOVERS: Final = Instrument("agentd_gateway_failovers", "agentd.gateway.failovers", "counter", "{call}",
                              "Model calls that moved on to the next endpoint")
BREAKER: Final = Instrument(
    "agentd_gateway_breaker_state", "agentd.gateway.breaker.state", "gauge", "1",
    "Endpoint breaker: 0 closed, 1 half-open, 2 open",
    (Label("endpoint", "agentd.gateway.endpoint", "display URL"),), doc="root process")
SUBAGENTS_LIVE: Final = Instrument(
    "agentd_subagents_live", "agentd.subagents.live", "gauge", "{subagent}",
    "Live subagents of the whole tree by depth (root process)", (DEPTH,), doc="counted at the root's chokepoint")
SPAWN_REFUSALS: Final = Instrument(
    "agentd_spawn_refusals", "agentd.spawn.refusals", "counter", "{spawn}", "Spawns refused at the chokepoint, by cap",
    (Label("cap", "agentd.cap", _values(*CAPS, "other")),), doc="whole tree")
WAKES: Final = Instrument("agentd_wakes", "agentd.wakes", "counter", "{wake}",
                          "Reactive wakes (runs started by an update, a timer or a cron)")
COALESCED: Final = Instrument("agentd_coalesced_updates", "agentd.coalesced_updates", "counter", "{update}",
                              "Resource updates merged into a pending wake")
SERVED_SESSIONS: Final = Instrument("agentd_served_sessions", "agentd.served.sessions", "updown", "{session}",
                                    "Open self-MCP sessions", doc="legacy wire")
SERVED_REQUESTS: Final = Instrument(
    "agentd_served_requests", "agentd.served.requests", "counter", "{request}", "Self-MCP requests by outcome",
    (Label("outcome", "agentd.outcome", _values(*SERVED_OUTCOMES)),))
JOURNAL_LAG: Final = Instrument(
    "agentd_journal_commit_lag_seconds", "agentd.journal.commit.lag", "histogram", "s",
    "Time from a step's end to its journal commit (--state-dir)", buckets=JOURNAL_LAG_BUCKETS,
    doc="the step's end is its model reply; buckets 0.5 ms … 5 s")
JOURNAL_QUEUE: Final = Instrument("agentd_journal_queue", "agentd.journal.queue", "updown", "{commit}",
                                  "Journal commits waiting or in progress (--state-dir)")
CLUSTER_MEMBER_FREE: Final = Instrument(
    "agentd_cluster_member_free_slots", "agentd.cluster.member.free_slots", "gauge", "{slot}",
    "This member's free slots (--cluster-capacity less what it runs)")
CLUSTER_MEMBERS: Final = Instrument(
    "agentd_cluster_members", "agentd.cluster.members", "gauge", "{member}",
    "Live cluster members (heartbeat within the TTL)", doc="cluster-wide, the same on every member")
CLUSTER_FREE: Final = Instrument("agentd_cluster_free_slots", "agentd.cluster.free_slots", "gauge", "{slot}",
                                 "Free slots over all live members", doc="cluster-wide")
CLUSTER_QUEUED: Final = Instrument(
    "agentd_cluster_queue_depth", "agentd.cluster.queue.depth", "gauge", "{item}",
    "Cluster work items no member has claimed", doc="due items, counted up to 100000; cluster-wide")
CLUSTER_OLDEST: Final = Instrument(
    "agentd_cluster_oldest_queued_age_seconds", "agentd.cluster.queue.oldest_age", "gauge", "s",
    "How long the oldest unclaimed cluster work item has waited (0: none)", doc="cluster-wide")
#: Read from the process, not recorded: Prometheus's process collector (with the other ``process_*``
#: series) and an OTLP observable up-down counter, as the convention has it.
PROCESS_MEMORY: Final = Instrument(
    "process_resident_memory_bytes", "process.memory.usage", "gauge", "By", "Resident memory of the process",
    otel_kind="updown", doc="the root process (Linux); Prometheus also has the other `process_*` series")

#: The recorded instruments (everything but :data:`PROCESS_MEMORY`), in the docs' order.
RECORDED: Final = (RUNS, STEPS, TOKENS, COST, TOOL_CALLS, MCP_DURATION, GATEWAY_DURATION, FAILOVERS, BREAKER,
                   SUBAGENTS_LIVE, SPAWN_REFUSALS, WAKES, COALESCED, SERVED_SESSIONS, SERVED_REQUESTS, JOURNAL_LAG,
                   JOURNAL_QUEUE, CLUSTER_MEMBER_FREE, CLUSTER_MEMBERS, CLUSTER_FREE, CLUSTER_QUEUED, CLUSTER_OLDEST)
#: Every series family agentd exports.
INSTRUMENTS: Final = (*RECORDED, PROCESS_MEMORY)

_PROM_WORDS: Final = {"counter": "counter", "gauge": "gauge", "updown": "gauge", "histogram": "histogram"}
_OTLP_WORDS: Final = {"counter": "counter", "gauge": "gauge", "updown": "up-down counter", "histogram": "histogram"}


def _label_cell(label: Label) -> str:
    cell = f"`{label.prom}` (`{label.otel}`)"
    return f"{cell}: {label.values}" if label.values else cell


def docs_table() -> str:
    """The metrics table of docs/observability.md, one row per instrument."""
    rows = ["| Prometheus | OTLP (unit) | type | labels (OTLP attributes) | meaning |", "|---|---|---|---|---|"]
    for inst in INSTRUMENTS:
        prom_kind, otlp_kind = _PROM_WORDS[inst.kind], _OTLP_WORDS[inst.otlp_kind]
        kind = prom_kind if prom_kind == otlp_kind else f"{prom_kind} / {otlp_kind}"
        labels = [_label_cell(label) for label in inst.labels]
        labels += [f"OTLP also `{key}` = `{value}`" for key, value in inst.otel_constants]
        meaning = inst.description + (f"; {inst.doc}" if inst.doc else "")
        cells = [f"`{inst.exposed}`", f"`{inst.otel}` (`{inst.unit}`)", kind, "; ".join(labels), meaning]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)
