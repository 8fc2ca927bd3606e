"""The configuration model: plain frozen values, no parsing.

Parsing lives next door (``argv.py``, ``env.py``, ``file.py``, ``host.py``, ``load.py``); validation in ``validate.py``.
Every duration is float seconds; every secret is a *reference* (``{{secret:NAME}}``), resolved only when
a connection is made (``agentd.security.secrets``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from agentd import defaults
from agentd.errors import ConfigError
from agentd.prices import Price

if TYPE_CHECKING:
    from agentd.transport.egress import EgressPolicy

Mode = Literal["once", "loop", "schedule", "reactive"]
LogLevel = Literal["debug", "info", "warn", "error"]
LogFormat = Literal["auto", "human", "json"]
#: ``era:`` of a server: ``auto`` (``initialize`` first, ``server/discover`` if refused), or one era only.
EraChoice = Literal["auto", "legacy", "modern"]
ERA_CHOICES: tuple[EraChoice, ...] = ("auto", "legacy", "modern")


def check_era(value: str, where: str) -> EraChoice:
    """An ``era:`` / ``--mcp-era`` value: one of :data:`ERA_CHOICES`."""
    for choice in ERA_CHOICES:
        if value == choice:
            return choice
    raise ConfigError(f"{where}: {value!r} is not an era (expected one of: {', '.join(ERA_CHOICES)})")


#: The client capabilities a host may declare to a server (``capabilities:``, ``--mcp-capabilities``):
#: ``sampling.tools`` lets the server offer its tools to a sampling request (and implies ``sampling``).
CLIENT_CAPABILITIES: tuple[str, ...] = ("elicitation", "sampling", "sampling.tools")


def check_capabilities(values: Sequence[str], where: str) -> tuple[str, ...]:
    """A server's opted-in client capabilities: each one of :data:`CLIENT_CAPABILITIES`, in that order."""
    for value in values:
        if value not in CLIENT_CAPABILITIES:
            raise ConfigError(f"{where}: {str(value)!r} is not a client capability (expected: "
                              f"{', '.join(CLIENT_CAPABILITIES)})")
    wanted = set(values) | ({"sampling"} if "sampling.tools" in values else set())
    return tuple(c for c in CLIENT_CAPABILITIES if c in wanted)


def check_approve(values: Sequence[str], where: str) -> tuple[str, ...]:
    """A server's tools that need approval: non-empty names (``*``: every tool), each once."""
    out: list[str] = []
    for value in values:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: a tool name must be a non-empty string")
        if value.strip() not in out:
            out.append(value.strip())
    return tuple(out)

OutputFormat = Literal["json", "human"]

MODES: tuple[Mode, ...] = ("once", "loop", "schedule", "reactive")
LOG_LEVELS: tuple[LogLevel, ...] = ("debug", "info", "warn", "error")


def _frozen_mapping(value: Mapping[str, str] | None) -> Mapping[str, str]:
    return dict(value or {})


def _optional_mapping(value: Mapping[str, str] | None) -> Mapping[str, str] | None:
    return None if value is None else dict(value)


@attrs.frozen
class TlsConfig:
    """Client-side TLS for one MCP server: a private CA bundle and/or a client certificate (mTLS)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None


@attrs.frozen
class EgressConfig:
    """``egress:`` in the config file: CIDRs that peer-supplied URLs may reach beyond public addresses
    (agentd.transport.egress). Link-local/metadata and loopback ranges need an entry inside them."""

    allow: tuple[str, ...] = ()

    def policy(self) -> EgressPolicy:
        from agentd.transport.egress import EgressPolicy

        return EgressPolicy.from_cidrs(self.allow)


@attrs.frozen
class EventSubscriptionConfig:
    """One MCP event a reactive daemon wakes on (``--on-event SERVER:EVENT``, ``on_events:``): the event type
    ``event`` of the declared server ``server``, with the subscription ``arguments`` sent on every poll."""

    server: str
    event: str
    arguments: Mapping[str, object] = attrs.field(factory=dict, converter=dict, hash=False)
    #: ``on_events[].delivery``: ``poll``, ``push`` or ``webhook`` (None: push if offered, else poll, else
    #: webhook where agentd serves HTTPS).
    delivery: str | None = None

    @property
    def shown(self) -> str:
        return f"{self.server}:{self.event}"


@attrs.frozen
class ConnectionCredentials:
    """How a host ``connections:`` entry authenticates beyond a header, as data: ``client_credentials``
    (discovery, then a token request; agentd.connections.auth) or ``oauth`` (the runtime module's credential
    provider, by ``profile``). Secret values stay references (``{{secret:NAME}}``), so a child agentd gets
    exactly the values they name in its payload and builds its own token source; the process that connects
    turns this into per-request auth through the installed credential source (agentd.client.credentials)."""

    type: Literal["oauth", "client_credentials"]
    profile: str | None = None
    client_id: str | None = None
    client_secret: str | None = None
    #: A PEM private key reference (``private_key_jwt``).
    private_key: str | None = None
    scopes: tuple[str, ...] = ()
    token_endpoint_auth_method: str | None = None
    signing_algorithm: str | None = None


@attrs.frozen
class McpServerConfig:
    """One declared MCP server. ``headers`` values are templates that may hold secret references."""

    name: str
    url: str
    required: bool = True
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_mapping)
    tls: TlsConfig | None = None
    connect_timeout: float = defaults.CONNECT_TIMEOUT
    call_timeout: float = defaults.CALL_TIMEOUT
    #: Rule-of-Two properties (agentd.security.rule_of_two.SERVER_TAGS) the operator gave this server; None: untagged (untrusted_input).
    tags: tuple[str, ...] | None = None
    #: The tools this server may offer and run (a host ``connections:`` allowlist, after its ``mode``);
    #: None: every tool the server lists. The connection hides the rest and refuses calls to them.
    tools: tuple[str, ...] | None = None
    #: Pinned tool hashes ``{tool: sha256-hex}`` (``pin:`` / ``pin_file:``, agentd.mcp.tool_hash); None: not
    #: pinned. A pinned server's tool whose hash differs, or that is not pinned at all, is refused.
    pin: Mapping[str, str] | None = attrs.field(default=None, converter=_optional_mapping)
    #: The protocol era to speak (docs/mcp-client.md, Eras): ``auto`` probes; ``legacy``/``modern`` never switch.
    era: EraChoice = defaults.MCP_ERA
    #: The tools that need a person's approval before each call (``approve:``, ``--approve SERVER__TOOL``;
    #: ``*``: every tool). docs/approvals.md.
    approve: tuple[str, ...] = ()
    #: The client capabilities declared to this server (``capabilities:``, ``--mcp-capabilities``): a subset of
    #: ``elicitation``, ``sampling``. Empty (the default): ``capabilities: {}``, both answered -32601.
    capabilities: tuple[str, ...] = ()
    #: Per-request authentication (an ``httpx.Auth``, e.g. agentd.connections.auth): adds credentials to
    #: every request and may retry once on 401. Not configuration text: set by agentd.connections only.
    auth: object | None = attrs.field(default=None, eq=False, repr=False)
    #: A host connection's OAuth / client-credentials settings (references only); the connecting process
    #: builds ``auth`` from them (agentd.client.credentials). None: headers alone authenticate.
    credentials: ConnectionCredentials | None = None
    #: A zero-argument factory of the ``httpx.AsyncClient`` for this server (a host's HTTP policy: transport,
    #: event hooks, redirects). None: agentd's own client (no redirects). Set by agentd.connections only.
    http_client: object | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class IntelligenceConfig:
    """The model gateway (help group "intelligence"; agentd.intelligence): where, with what token, which models
    at what price."""

    #: ``--intelligence``: OpenAI-compatible base URLs, in failover order (``test``: the offline model).
    endpoints: tuple[str, ...] = ()
    #: ``--intelligence-token``: a secret reference, never a value.
    token: str | None = None
    model: str = defaults.MODEL
    #: ``--models``: the models a ``subagent.spawn`` may choose (its ``model``) besides the run's own; empty: only
    #: the run's own model.
    models: tuple[str, ...] = ()
    #: ``--price MODEL=IN/OUT`` / ``prices:``: each model's price (agentd.prices: picodollars per token).
    prices: Mapping[str, Price] = attrs.field(factory=dict, converter=dict)
    #: ``--stream-intelligence``: stream gateway replies (SSE).
    stream: bool = False


@attrs.frozen
class SelfMcpConfig:
    """The self-MCP server (``--serve-*``, help group "self-MCP server"; agentd.selfmcp): where it listens, how
    callers authenticate, and the caps that bound what they may hold open."""

    #: ``--serve-mcp``: the URL to serve MCP on; None: no self-MCP server.
    mcp: str | None = None
    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None
    bearer: str | None = None
    #: OAuth access tokens on the served side (agentd.transport.resource_server): the authorization server,
    #: the audience tokens must name (None: the served URL) and the scopes every token must carry.
    oauth_issuer: str | None = None
    oauth_audience: str | None = None
    oauth_scope: tuple[str, ...] = ()
    #: A scope that makes a token's holder an operator: it sees every principal's served handles, tasks and
    #: ``/events`` lines (agentd.transport.tenancy). None: no token is an operator.
    oauth_operator_scope: str | None = None
    max_spawns: int = defaults.SERVE_MAX_SPAWNS
    max_sessions: int = defaults.SERVE_MAX_SESSIONS
    max_warm: int = defaults.SERVE_MAX_WARM
    max_queued: int = defaults.SERVE_MAX_QUEUED
    max_body: int = defaults.SERVE_MAX_BODY
    keepalive: float = defaults.SERVE_KEEPALIVE
    retention: float = defaults.SERVE_RETENTION
    max_connections: int = defaults.SERVE_MAX_CONNECTIONS
    max_per_client: int = defaults.SERVE_MAX_PER_CLIENT
    http2: bool = False
    #: Also serve A2A on the --serve-mcp listener (agentd/selfmcp/a2a.py).
    a2a: bool = False
    #: Serve MCP tasks on the 2025-11-25 wire too (agentd/selfmcp/tasks.py; the modern wire always may).
    tasks: bool = False
    #: 2025-11-25 wire: ``notifications/cancelled`` for an in-flight request cancels it, and a sync
    #: ``subagent.spawn``'s run with it (the kill ladder); off, the notification is ignored (the design's v1).
    accept_cancel: bool = False


@attrs.frozen
class JournalConfig:
    """The run journal (``--state-dir``, ``--journal-keep-*``; agentd.journal): where it lives and what it keeps."""

    #: Where the run journal lives (``--state-dir``); ``None``: no journal is opened.
    state_dir: str | None = None
    keep_for: float = defaults.JOURNAL_KEEP_FOR
    keep_runs: int = defaults.JOURNAL_KEEP_RUNS


@attrs.frozen
class ClusterConfig:
    """Cluster membership (``--cluster*``, the config file's ``cluster: {dsn, capacity, lease_ttl}``;
    agentd.cluster)."""

    #: ``--cluster``: the PostgreSQL DSN of the shared journal (secret-free); ``None``: not a member.
    dsn: str | None = None
    capacity: int = defaults.CLUSTER_CAPACITY
    lease_ttl: float = defaults.CLUSTER_LEASE_TTL


@attrs.frozen
class TelemetryConfig:
    """Logs, traces, metrics and the result files (help group "telemetry", the config file's ``telemetry:``)."""

    log_level: LogLevel = defaults.LOG_LEVEL
    log_content: bool = False
    #: stderr: ``auto`` (human at a terminal), ``human`` or ``json`` (agentd.terminal decides).
    log_format: LogFormat = defaults.LOG_FORMAT
    #: stdout: None is the command's own default (a run: json; ``agentd check``: human at a terminal).
    output: OutputFormat | None = None
    otel: bool = False
    traceparent: str | None = None
    metrics_addr: str | None = None
    health_file: str | None = None
    report_file: str | None = None


@attrs.frozen
class BudgetsConfig:
    """What a run, its subagent tree and a daemon may spend (``--max-steps``, ``--max-tokens``, ``--deadline``,
    ``--token-ceiling``, ``--budget-*``; docs/costs.md)."""

    max_steps: int = defaults.MAX_STEPS
    max_tokens: int = defaults.MAX_TOKENS
    deadline: float = defaults.DEADLINE
    #: ``--token-ceiling``: the whole subagent tree's tokens.
    token_ceiling: int = defaults.TOKEN_CEILING
    #: ``--budget-usd``: the whole tree's money budget in picodollars (agentd.prices); None: no money budget.
    usd: int | None = None
    #: ``--budget-tokens-lifetime``: a daemon's tokens over its whole life; 0: no bound.
    tokens_lifetime: int = 0
    #: ``--budget-exit-code``: replaces exit codes 3 (partial) and 7 (budget) when set.
    exit_code: int | None = None


@attrs.frozen
class SubagentsConfig:
    """The subagent tree's caps (``--max-depth``, ``--max-children``, ``--max-subagents``, ``--spawn-*``;
    agentd.supervisor.caps)."""

    max_depth: int = defaults.MAX_DEPTH
    max_children: int = defaults.MAX_CHILDREN
    #: ``--max-subagents``: subagents in the whole tree.
    max_total: int = defaults.MAX_SUBAGENTS
    spawn_rate: int = defaults.SPAWN_RATE
    spawn_burst: int = defaults.SPAWN_BURST


@attrs.frozen
class LadderConfig:
    """How agentd stops what it started: the kill ladder's graces and liveness limits for a child
    (agentd.supervisor.ladder) and the daemon's drain on SIGTERM (``--drain-timeout``; agentd.oversight.drain)."""

    cancel_grace: float = defaults.CANCEL_GRACE
    term_grace: float = defaults.TERM_GRACE
    pong_timeout: float = defaults.PONG_TIMEOUT
    progress_timeout: float = defaults.PROGRESS_TIMEOUT
    drain_timeout: float = defaults.DRAIN_TIMEOUT


@attrs.frozen
class ModesConfig:
    """What wakes a ``loop``, ``schedule`` or ``reactive`` daemon and how often (help group "modes";
    docs/reactive.md). The mode itself is :attr:`Config.mode`."""

    subscribe: tuple[str, ...] = ()
    continue_uris: tuple[str, ...] = ()
    #: MCP events the reactive daemon wakes on (agentd.modes.events).
    on_events: tuple[EventSubscriptionConfig, ...] = ()
    interval: float | None = None
    cron: str | None = None
    cron_tz: str | None = None
    poll_interval: float | None = None
    debounce: float = defaults.DEBOUNCE
    max_concurrent_wakes: int = defaults.MAX_CONCURRENT_WAKES
    max_uris_per_wake: int = defaults.MAX_URIS_PER_WAKE
    max_wakes_per_minute: int = defaults.MAX_WAKES_PER_MINUTE
    max_wakes_per_uri_per_minute: int = defaults.MAX_WAKES_PER_URI_PER_MINUTE


@attrs.frozen
class Config:
    """Everything one agentd process was asked to do. Build it with :func:`agentd.config.load.load_config`
    (what the CLI does); settings are grouped as the CLI help groups them (docs/config.md, Settings in Python)."""

    # what to do
    instruction: str | None = None
    instruction_file: str | None = None
    output_contract: str | None = None
    mode: Mode = "once"
    run_id: str = ""
    # MCP servers and TLS
    mcp: tuple[McpServerConfig, ...] = ()
    #: A2A peers (``--a2a-peer``, ``a2a_peers:``), declared like MCP servers (agentd/config/a2a.py).
    a2a_peers: tuple[McpServerConfig, ...] = ()
    tls_ca: str | None = None
    # the config file itself
    config_path: str | None = None
    #: ``--runtime-module``: the trusted Python module whose ``connection_credentials`` serves ``auth: oauth``
    #: connections (agentd.connections.runtime); a child agentd loads the same file for its own connections.
    runtime_module: str | None = None
    validate_config: bool = False
    #: The operator control socket (``--ctl-socket``; agentd.ctl.server.socket_path gives its default).
    ctl_socket: str | None = None
    # security: peer-supplied URLs (the config file's egress section) and the Rule of Two
    egress: EgressConfig = attrs.field(factory=EgressConfig)
    allow_trifecta: bool = False
    # the groups
    intelligence: IntelligenceConfig = attrs.field(factory=IntelligenceConfig)
    modes: ModesConfig = attrs.field(factory=ModesConfig)
    budgets: BudgetsConfig = attrs.field(factory=BudgetsConfig)
    subagents: SubagentsConfig = attrs.field(factory=SubagentsConfig)
    ladder: LadderConfig = attrs.field(factory=LadderConfig)
    journal: JournalConfig = attrs.field(factory=JournalConfig)
    cluster: ClusterConfig = attrs.field(factory=ClusterConfig)
    telemetry: TelemetryConfig = attrs.field(factory=TelemetryConfig)
    serve: SelfMcpConfig = attrs.field(factory=SelfMcpConfig)

    def usable_models(self) -> tuple[str, ...]:
        """The models this run and its subagents may call: its own, then ``models`` (each once)."""
        return tuple(dict.fromkeys((self.intelligence.model, *self.intelligence.models)))

    def price(self) -> Price | None:
        """The run's own model's price when every model the tree may use has one (then the run reports what it
        cost); None when any lacks one: a sum that counted an unpriced model as free would mislead."""
        prices = self.intelligence.prices
        if not prices or any(m not in prices for m in self.usable_models()):
            return None
        return prices[self.intelligence.model]

    def server(self, name: str) -> McpServerConfig:
        """The declared server called ``name`` (KeyError if none)."""
        for server in self.mcp:
            if server.name == name:
                return server
        raise KeyError(name)


def _flat_names(group: str, cls: type[Any], prefix: str = "", **renamed: str) -> dict[str, tuple[str, str]]:
    return {renamed.get(f.name, prefix + f.name): (group, f.name) for f in attrs.fields(cls)}


#: Each group of :class:`Config` and its class.
GROUPS: Final[Mapping[str, type[Any]]] = {
    "intelligence": IntelligenceConfig, "modes": ModesConfig, "budgets": BudgetsConfig, "subagents": SubagentsConfig, "ladder": LadderConfig,
    "journal": JournalConfig, "cluster": ClusterConfig, "telemetry": TelemetryConfig, "serve": SelfMcpConfig,
}

#: A grouped setting's flat name (the flag table's ``dest``, the config file's top-level key, the name a reload,
#: ``--validate-config``'s document, a run's ``config_digest`` and a child's wire config use) -> (group, field).
FLAT_NAMES: Final[Mapping[str, tuple[str, str]]] = {
    **_flat_names("intelligence", IntelligenceConfig, "", endpoints="intelligence", token="intelligence_token",
                  stream="stream_intelligence"),
    **_flat_names("modes", ModesConfig),
    **_flat_names("budgets", BudgetsConfig, usd="budget_usd", tokens_lifetime="budget_tokens_lifetime",
                  exit_code="budget_exit_code"),
    **_flat_names("subagents", SubagentsConfig, max_total="max_subagents"),
    **_flat_names("ladder", LadderConfig),
    **_flat_names("journal", JournalConfig, "journal_", state_dir="state_dir"),
    **_flat_names("cluster", ClusterConfig, "cluster_", dsn="cluster"),
    **_flat_names("telemetry", TelemetryConfig),
    **_flat_names("serve", SelfMcpConfig, "serve_"),
}


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Settings by flat name -> :class:`Config`'s keyword arguments, each group's settings as a dict (a
    name that is no grouped setting stays as it is)."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        where = FLAT_NAMES.get(name)
        if where is None:
            out[name] = value
        else:
            out.setdefault(where[0], {})[where[1]] = value
    return out


def from_flat(flat: Mapping[str, Any]) -> Config:
    """The :class:`Config` of settings by flat name (the loader's layers, a harness's overrides). A group may
    also be given whole (``budgets=BudgetsConfig(...)``); flat settings of that group then change it."""
    given = {name: value for name, value in flat.items() if name in GROUPS and isinstance(value, GROUPS[name])}
    kwargs = nested({name: value for name, value in flat.items() if name not in given})
    for name, value in kwargs.items():
        if name in GROUPS and isinstance(value, dict):
            kwargs[name] = attrs.evolve(given.pop(name), **value) if name in given else GROUPS[name](**value)
    return Config(**kwargs, **given)


def flattened(doc: Mapping[str, Any]) -> dict[str, Any]:
    """An ``attrs.asdict`` / unstructured :class:`Config` by flat name: each group's dict spread into the flat
    names its settings have on the command line and in the config file."""
    out: dict[str, Any] = {}
    names = {where: name for name, where in FLAT_NAMES.items()}
    for key, value in doc.items():
        if key in GROUPS and isinstance(value, Mapping):
            out.update({names[(key, field)]: item for field, item in value.items()})
        else:
            out[key] = value
    return out


def flat_settings(config: Config) -> dict[str, Any]:
    """Every setting of ``config`` by flat name, values as held (not recursed into)."""
    out = {f.name: getattr(config, f.name) for f in attrs.fields(Config) if f.name not in GROUPS}
    out.update({name: getattr(getattr(config, group), field) for name, (group, field) in FLAT_NAMES.items()})
    return out
