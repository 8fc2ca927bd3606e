"""The configuration model: plain frozen values, no parsing.

Parsing lives next door (``argv.py``, ``env.py``, ``file.py``, ``host.py``, ``load.py``); validation in ``validate.py``.
Every duration is float seconds; every secret is a *reference* (``{{secret:NAME}}``), resolved only when
a connection is made (``agentd.secrets``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

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
    #: Rule-of-Two properties (agentd.rule_of_two.SERVER_TAGS) the operator gave this server; None: untagged (untrusted_input).
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
class Config:
    """Everything one agentd process was asked to do. Build it with :meth:`from_argv` (what the CLI does)."""

    # what to do
    instruction: str | None = None
    instruction_file: str | None = None
    output_contract: str | None = None
    # intelligence
    intelligence: tuple[str, ...] = ()
    intelligence_token: str | None = None
    model: str = defaults.MODEL
    #: ``--models``: the models a ``subagent.spawn`` may choose (its ``model``) besides the run's own; empty: only
    #: the run's own model.
    models: tuple[str, ...] = ()
    #: ``--price MODEL=IN/OUT`` / ``prices:``: each model's price (agentd.prices: picodollars per token).
    prices: Mapping[str, Price] = attrs.field(factory=dict, converter=dict)
    stream_intelligence: bool = False
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
    # modes
    mode: Mode = "once"
    subscribe: tuple[str, ...] = ()
    continue_uris: tuple[str, ...] = ()
    #: MCP events the reactive daemon wakes on (agentd.reactive.events).
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
    # per-run budgets
    max_steps: int = defaults.MAX_STEPS
    max_tokens: int = defaults.MAX_TOKENS
    deadline: float = defaults.DEADLINE
    # subagent tree caps and the kill ladder
    max_depth: int = defaults.MAX_DEPTH
    max_children: int = defaults.MAX_CHILDREN
    max_subagents: int = defaults.MAX_SUBAGENTS
    spawn_rate: int = defaults.SPAWN_RATE
    spawn_burst: int = defaults.SPAWN_BURST
    token_ceiling: int = defaults.TOKEN_CEILING
    #: ``--budget-usd``: the whole tree's money budget in picodollars (agentd.prices); None: no money budget.
    budget_usd: int | None = None
    cancel_grace: float = defaults.CANCEL_GRACE
    term_grace: float = defaults.TERM_GRACE
    pong_timeout: float = defaults.PONG_TIMEOUT
    progress_timeout: float = defaults.PROGRESS_TIMEOUT
    # daemon lifetime
    drain_timeout: float = defaults.DRAIN_TIMEOUT
    budget_tokens_lifetime: int = 0
    #: Replaces exit codes 3 (partial) and 7 (budget) when set, as the original's --budget-exit-code.
    budget_exit_code: int | None = None
    # identity and telemetry
    run_id: str = ""
    #: Where the run journal lives (``--state-dir``); ``None``: no journal is opened.
    state_dir: str | None = None
    journal_keep_for: float = defaults.JOURNAL_KEEP_FOR
    journal_keep_runs: int = defaults.JOURNAL_KEEP_RUNS
    #: The operator control socket (``--ctl-socket``; agentd.ctl.server.socket_path gives its default).
    ctl_socket: str | None = None
    #: ``--cluster``: the PostgreSQL DSN of the shared journal (secret-free); ``None``: not a member.
    cluster: str | None = None
    cluster_capacity: int = defaults.CLUSTER_CAPACITY
    cluster_lease_ttl: float = defaults.CLUSTER_LEASE_TTL
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
    # the self-MCP server
    serve_mcp: str | None = None
    serve_cert: str | None = None
    serve_key: str | None = None
    serve_client_ca: str | None = None
    serve_bearer: str | None = None
    #: OAuth access tokens on the served side (agentd.transport.resource_server): the authorization server,
    #: the audience tokens must name (None: the served URL) and the scopes every token must carry.
    serve_oauth_issuer: str | None = None
    serve_oauth_audience: str | None = None
    serve_oauth_scope: tuple[str, ...] = ()
    #: A scope that makes a token's holder an operator: it sees every principal's served handles, tasks and
    #: ``/events`` lines (agentd.transport.tenancy). None: no token is an operator.
    serve_oauth_operator_scope: str | None = None
    serve_max_spawns: int = defaults.SERVE_MAX_SPAWNS
    serve_max_sessions: int = defaults.SERVE_MAX_SESSIONS
    serve_max_warm: int = defaults.SERVE_MAX_WARM
    serve_max_queued: int = defaults.SERVE_MAX_QUEUED
    serve_max_body: int = defaults.SERVE_MAX_BODY
    serve_keepalive: float = defaults.SERVE_KEEPALIVE
    serve_retention: float = defaults.SERVE_RETENTION
    serve_max_connections: int = defaults.SERVE_MAX_CONNECTIONS
    serve_max_per_client: int = defaults.SERVE_MAX_PER_CLIENT
    serve_http2: bool = False
    #: Also serve A2A on the --serve-mcp listener (agentd/selfmcp/a2a.py).
    serve_a2a: bool = False
    #: Serve MCP tasks on the 2025-11-25 wire too (agentd/selfmcp/tasks.py; the modern wire always may).
    serve_tasks: bool = False
    #: 2025-11-25 wire: ``notifications/cancelled`` for an in-flight request cancels it, and a sync
    #: ``subagent.spawn``'s run with it (the kill ladder); off, the notification is ignored (the design's v1).
    serve_accept_cancel: bool = False
    # security: peer-supplied URLs (the config file's egress section) and the Rule of Two
    egress: EgressConfig = attrs.field(factory=EgressConfig)
    allow_trifecta: bool = False

    if TYPE_CHECKING:  # attached by agentd.config.load (the loader builds a Config; the model imports no loader)

        @staticmethod
        def from_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Config:
            """Exactly what the CLI does: defaults < ``--config`` file < environment < flags, then validation.

            ``env`` defaults to ``os.environ``. Reads the config file and ``--instruction-file`` but opens no
            socket and starts no process.

            Raises:
                ConfigError: one line naming the bad value (exit 2).
            """
            ...

    def usable_models(self) -> tuple[str, ...]:
        """The models this run and its subagents may call: its own, then ``models`` (each once)."""
        return tuple(dict.fromkeys((self.model, *self.models)))

    def price(self) -> Price | None:
        """The run's own model's price when every model the tree may use has one (then the run reports what it
        cost); None when any lacks one: a sum that counted an unpriced model as free would mislead."""
        if not self.prices or any(m not in self.prices for m in self.usable_models()):
            return None
        return self.prices[self.model]

    def server(self, name: str) -> McpServerConfig:
        """The declared server called ``name`` (KeyError if none)."""
        for server in self.mcp:
            if server.name == name:
                return server
        raise KeyError(name)
