"""The host config: its shapes, and the connections it declares, checked completely before anything opens.

::

    version: "1.0"
    intelligence: {url: http://gw/v1, model: m, key: {env: GATEWAY_KEY}}
    connections:
      documents:
        driver: mcp
        transport: streamable-http
        url: {env: DOCUMENTS_MCP_URL}
        auth: {type: bearer, token: {env: DOCUMENTS_MCP_TOKEN}}
        headers: {X-Workspace: {env: DOCUMENTS_WORKSPACE}}
        mode: read
        tools: [search, read]
        readTools: [search, read]
        required: true
        connectTimeoutMs: 10000
        toolTimeoutMs: 30000
        pin: {search: 3f1c...e9}   # or pin_file: documents.pins.yaml (tool hashes, as for mcp_servers)
        era: auto                  # or legacy | modern (as for mcp_servers)
    mcp_servers: [...]          # the list form (agentd.config.servers), mapped into the same model
    transcript: {path: runs.sqlite3, dataPolicy: full, retentionDays: 30}

One host file serves both ``agentd run`` (:func:`load_host`: the whole file as a :class:`Host`) and plain
``agentd --config host.yaml`` (agentd.config.file calls :func:`load_connections`,
:func:`intelligence_settings`, :func:`check_version`, :func:`check_transcript` for the host keys): each
``connections:`` entry becomes an ordinary MCP server carrying the tools its ``mode`` allows. The checks and
their paths are the same for both, so an error names the exact value and the process exits 2 before it
opens anything. Environment *references* are checked for presence here, never read into memory (a secret is
read when a connection is made, through agentd.security.secrets).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import attrs

from agentd import defaults
from agentd.config.egress import load_egress
from agentd.config.model import (
    ConnectionCredentials,
    EgressConfig,
    EraChoice,
    McpServerConfig,
    TlsConfig,
    check_era,
)
from agentd.config.servers import load_pins, load_servers
from agentd.config.structure import EnvRef, FieldError, converter, register_aliases, str_or_env, structure
from agentd.config.validate import check_operator_egress
from agentd.config.yaml_file import read_mapping
from agentd.errors import ConfigError
from agentd.formats.tool_separator import SEPARATOR
from agentd.security.secrets import check_refs_available

Mode = Literal["read", "read_write"]
DataPolicy = Literal["full", "redact_tool_values", "metadata_only"]

#: A connection name (and a manifest's alias): the prefix the model sees, so never the separator.
ALIAS: Final = re.compile(r"^[A-Za-z][A-Za-z0-9-]*(_[A-Za-z0-9-]+)*$")
_CREDENTIAL_HEADER: Final = re.compile(r"(authorization|cookie|token|secret|api[-_]?key|password)", re.I)


# --- auth ------------------------------------------------------------------------------------------------


@attrs.frozen
class AuthNone:
    type: Literal["none"] = "none"


@attrs.frozen
class AuthBearer:
    token: EnvRef
    type: Literal["bearer"] = "bearer"


@attrs.frozen
class AuthOAuth:
    """Credentials come from the runtime module's ``connection_credentials`` provider, by profile."""

    profile: str
    type: Literal["oauth"] = "oauth"


@attrs.frozen
class AuthClientCredentials:
    """The OAuth client-credentials grant, with discovery (RFC 9728, RFC 8414)."""

    client_id: EnvRef = attrs.field(alias="clientId")
    client_secret: EnvRef | None = attrs.field(default=None, alias="clientSecret")
    #: A PEM private key (from the environment) for ``private_key_jwt``.
    private_key: EnvRef | None = attrs.field(default=None, alias="privateKey")
    scopes: list[str] = attrs.field(factory=list)
    #: ``client_secret_basic`` | ``client_secret_post`` | ``private_key_jwt``; default: from the key/secret
    #: given and what the authorization server advertises.
    token_endpoint_auth_method: (
        Literal["client_secret_basic", "client_secret_post", "private_key_jwt"] | None
    ) = attrs.field(default=None, alias="tokenEndpointAuthMethod")
    signing_algorithm: Literal["RS256", "ES256"] | None = attrs.field(default=None, alias="signingAlgorithm")
    type: Literal["client_credentials"] = "client_credentials"

    def __attrs_post_init__(self) -> None:
        method = self.token_endpoint_auth_method
        if method == "private_key_jwt" and self.private_key is None:
            raise FieldError("tokenEndpointAuthMethod private_key_jwt needs privateKey: {env: NAME}")
        if method in ("client_secret_basic", "client_secret_post") and self.client_secret is None:
            raise FieldError(f"tokenEndpointAuthMethod {method} needs clientSecret: {{env: NAME}}")
        if self.client_secret is None and self.private_key is None:
            raise FieldError("client_credentials needs clientSecret or privateKey (an {env: NAME} reference)")


Auth = AuthNone | AuthBearer | AuthOAuth | AuthClientCredentials
_AUTH_TYPES: dict[str, type[Any]] = {
    "none": AuthNone,
    "bearer": AuthBearer,
    "oauth": AuthOAuth,
    "client_credentials": AuthClientCredentials,
}


def _auth(value: Any, _: Any) -> Auth:
    if not isinstance(value, Mapping):
        raise FieldError(f"expected a mapping with 'type', got {type(value).__name__}")
    kind = value.get("type")
    cls = _AUTH_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise FieldError(f"auth type must be one of {', '.join(_AUTH_TYPES)}, got {kind!r}")
    result: Auth = converter.structure(value, cls)
    return result


converter.register_structure_hook(Auth, _auth)


# --- host ------------------------------------------------------------------------------------------------


@attrs.frozen
class HostConnection:
    """One host-configured MCP connection. ``tools`` is the complete allowlist (``None``: everything the
    server lists, which only the earlier ``mcp_servers[]`` entries and ``--mcp`` flags produce)."""

    url: str | EnvRef
    tools: list[str] | None
    driver: Literal["mcp"] = "mcp"
    transport: Literal["streamable-http"] = "streamable-http"
    auth: Auth = attrs.field(factory=AuthNone)
    headers: dict[str, str | EnvRef] = attrs.field(factory=dict)
    mode: Mode = "read"
    read_tools: list[str] = attrs.field(factory=list, alias="readTools")
    required: bool = True
    connect_timeout_ms: int = attrs.field(default=int(defaults.CONNECT_TIMEOUT * 1000), alias="connectTimeoutMs")
    tool_timeout_ms: int = attrs.field(default=int(defaults.CALL_TIMEOUT * 1000), alias="toolTimeoutMs")
    pin: dict[str, str] | None = None
    pin_file: str | None = None
    era: str = defaults.MCP_ERA


@attrs.frozen
class HostIntelligence:
    url: str | EnvRef | list[str | EnvRef]
    model: str = defaults.MODEL
    key: EnvRef | None = None


@attrs.frozen
class TranscriptSettings:
    enabled: bool = True
    #: SQLite file; relative paths are relative to the host config's directory.
    path: str | None = None
    data_policy: DataPolicy = attrs.field(default="full", alias="dataPolicy")
    retention_days: int = attrs.field(default=30, alias="retentionDays")


@attrs.frozen
class HostFile:
    """The host config file's own keys (``mcp_servers`` is structured by agentd.config.servers, then mapped)."""

    version: str = "1.0"
    intelligence: HostIntelligence | None = None
    connections: dict[str, HostConnection] = attrs.field(factory=dict)
    transcript: TranscriptSettings = attrs.field(factory=TranscriptSettings)


def _url_list(value: Any, _: Any) -> str | EnvRef | list[str | EnvRef]:
    if isinstance(value, list):
        return [str_or_env(v) for v in value]
    return str_or_env(value)


converter.register_structure_hook(str | EnvRef | list[str | EnvRef], _url_list)


register_aliases(AuthClientCredentials, HostConnection, TranscriptSettings)


# --- connections ------------------------------------------------------------------------------------------


@attrs.frozen
class Connection:
    """One host connection in the unified model (from ``connections:``, ``mcp_servers[]`` or ``--mcp``)."""

    name: str
    url: str
    headers: Mapping[str, str]  # templates: ``{{secret:NAME}}`` for references
    auth: Auth
    mode: Mode
    tools: tuple[str, ...] | None  # None: every tool the server lists
    read_tools: tuple[str, ...]
    required: bool
    connect_timeout: float
    call_timeout: float
    tls: TlsConfig | None = None
    source: str = "connections"  # "connections" | "mcp_servers" | "--mcp"
    #: Pinned tool hashes (``pin:`` / ``pin_file:``); None: not pinned (agentd.config.model.McpServerConfig.pin).
    pin: Mapping[str, str] | None = None
    era: EraChoice = defaults.MCP_ERA

    def allowed(self, mode: Mode) -> tuple[str, ...] | None:
        """The tools a binding in ``mode`` may be offered (None: all)."""
        if mode == "read" or self.mode == "read":
            return self.read_tools
        return self.tools


@attrs.frozen
class Host:
    path: str | None
    version: str
    intelligence: HostIntelligence | None
    connections: Mapping[str, Connection]
    transcript: TranscriptSettings
    transcript_path: str | None
    #: ``egress:``: what peer-supplied URLs (OAuth discovery) may reach beyond public addresses.
    egress: EgressConfig = attrs.field(factory=EgressConfig)


def load_host(path: str | None, env: Mapping[str, str], *, mcp_flags: Sequence[McpServerConfig] = ()) -> Host:
    """The host config (``path`` may be None: only ``--mcp`` flags), checked completely."""
    raw: dict[Any, Any] = read_mapping(path, "--config") if path is not None else {}
    base_dir = os.path.dirname(os.path.abspath(path)) if path is not None else os.getcwd()
    legacy_raw = raw.pop("mcp_servers", None)
    egress_raw = raw.pop("egress", None)
    prefix = f"--config {path}: " if path is not None else ""
    try:
        egress = load_egress(egress_raw)
        parsed = structure(raw, HostFile, path="$")
        connections: dict[str, Connection] = {}
        for name, entry in parsed.connections.items():
            connections[name] = connection_from_entry(name, entry, env, f"$.connections.{name}", base_dir)
        legacy: tuple[McpServerConfig, ...] = ()
        if legacy_raw is not None:
            legacy = load_servers(legacy_raw, base_dir)
        for source, servers in (("mcp_servers", legacy), ("--mcp", tuple(mcp_flags))):
            for index, server in enumerate(servers):
                where = f"$.mcp_servers[{index}]" if source == "mcp_servers" else f"--mcp {server.name}"
                if server.name in connections:
                    raise ConfigError(f"{where}: connection {server.name!r} is declared twice")
                for template in server.headers.values():
                    _refs_present(template, env, where)
                connections[server.name] = connection_from_server(server, source)
        policy = egress.policy()
        for name, connection in connections.items():  # operator endpoints: private addresses are opt-in
            check_operator_egress(f"connection {name!r}", connection.url, policy)
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc}") from None
    transcript_path = parsed.transcript.path
    if transcript_path is not None and not os.path.isabs(transcript_path):
        transcript_path = os.path.join(base_dir, os.path.expanduser(transcript_path))
    return Host(path, parsed.version, parsed.intelligence, connections, parsed.transcript, transcript_path,
                egress)


def _refs_present(template: str, env: Mapping[str, str], where: str) -> None:
    try:
        check_refs_available(template, env)
    except ConfigError as exc:
        raise ConfigError(f"{exc} @ {where}") from None


def _env_present(ref: EnvRef, env: Mapping[str, str], where: str) -> None:
    if ref.env not in env:
        raise ConfigError(f"environment variable {ref.env} is not set @ {where}")


def connection_from_entry(
    name: str, entry: HostConnection, env: Mapping[str, str], where: str, base_dir: str
) -> Connection:
    from agentd.config.validate import check_server

    if isinstance(entry.url, EnvRef):
        _env_present(entry.url, env, f"{where}.url")
        url = env[entry.url.env]
    else:
        url = entry.url
    assert entry.tools is not None  # required in a connections: entry (structure enforces it)
    if len(set(entry.tools)) != len(entry.tools):
        raise ConfigError(f"a tool is listed twice @ {where}.tools")
    for index, tool in enumerate(entry.read_tools):
        if tool not in entry.tools:
            raise ConfigError(f"readTools names {tool!r}, which is not in tools @ {where}.readTools[{index}]")
    headers: dict[str, str] = {}
    for header, value in entry.headers.items():
        if isinstance(value, EnvRef):
            _env_present(value, env, f"{where}.headers.{header}")
            headers[header] = value.template()
        elif _CREDENTIAL_HEADER.search(header):
            raise ConfigError(
                f"header {header!r} carries a credential: use {{env: NAME}}, not a literal @ {where}.headers.{header}"
            )
        else:
            headers[header] = value
    if isinstance(entry.auth, AuthBearer):
        if any(h.lower() == "authorization" for h in headers):
            raise ConfigError(f"auth type bearer sets Authorization; do not set it in headers too @ {where}")
        _env_present(entry.auth.token, env, f"{where}.auth.token")
        headers["Authorization"] = "Bearer " + entry.auth.token.template()
    elif isinstance(entry.auth, AuthClientCredentials):
        for field in ("client_id", "client_secret", "private_key"):
            ref = getattr(entry.auth, field)
            if ref is not None:
                alias = {
                    "client_id": "clientId",
                    "client_secret": "clientSecret",
                    "private_key": "privateKey",
                }
                _env_present(ref, env, f"{where}.auth.{alias[field]}")
    connection = Connection(
        name=name,
        url=url,
        headers=headers,
        auth=entry.auth,
        mode=entry.mode,
        tools=tuple(entry.tools),
        read_tools=tuple(entry.read_tools),
        required=entry.required,
        connect_timeout=max(entry.connect_timeout_ms, 1) / 1000,
        call_timeout=max(entry.tool_timeout_ms, 1) / 1000,
        pin=load_pins(entry.pin, entry.pin_file, base_dir, where),
        era=check_era(entry.era, f"{where}.era"),
    )
    try:
        check_server(_probe(connection), what=where)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace(f"{where}: ", "") + f" @ {where}") from None
    return connection


def _probe(connection: Connection) -> McpServerConfig:
    """The server entry the generic checks (URL, header names, inline credentials) look at."""
    return McpServerConfig(
        name=connection.name if re.match(r"^[A-Za-z0-9_-]+$", connection.name) else "connection",
        url=connection.url,
        headers=dict(connection.headers),
        connect_timeout=connection.connect_timeout,
        call_timeout=connection.call_timeout,
    )


def connection_from_server(server: McpServerConfig, source: str) -> Connection:
    return Connection(
        name=server.name,
        url=server.url,
        headers=dict(server.headers),
        auth=AuthNone(),
        mode="read_write",
        tools=None,
        read_tools=(),
        required=server.required,
        connect_timeout=server.connect_timeout,
        call_timeout=server.call_timeout,
        tls=server.tls,
        source=source,
        pin=server.pin,
        era=server.era,
    )



# --- the host keys in a plain agentd config file ----------------------------------------------------------


def load_connections(raw: Any, env: Mapping[str, str], base_dir: str) -> tuple[McpServerConfig, ...]:
    """``connections:`` as server entries with their allowlists (ConfigError naming the path)."""
    parsed = structure({"connections": raw}, HostFile, path="$")
    servers: list[McpServerConfig] = []
    for name, entry in parsed.connections.items():
        where = f"$.connections.{name}"
        if not ALIAS.match(name) or SEPARATOR in name:
            raise ConfigError(
                f"connection name {name!r} must start with a letter and use letters, digits, '-' and single '_' "
                f"(never '__', the tool-name separator) @ {where}"
            )
        server = _allowlisted_server(connection_from_entry(name, entry, env, where, base_dir))
        credentials = connection_credentials(entry.auth)
        servers.append(server if credentials is None else attrs.evolve(server, credentials=credentials))
    return tuple(servers)


def connection_credentials(auth: Auth) -> ConnectionCredentials | None:
    """An ``oauth`` / ``client_credentials`` entry as the server's credential settings (references only), for
    the process that connects to build its token source from (agentd.client.credentials); None otherwise."""
    if isinstance(auth, AuthOAuth):
        return ConnectionCredentials(type="oauth", profile=auth.profile)
    if isinstance(auth, AuthClientCredentials):
        return ConnectionCredentials(
            type="client_credentials",
            client_id=auth.client_id.template(),
            client_secret=auth.client_secret.template() if auth.client_secret is not None else None,
            private_key=auth.private_key.template() if auth.private_key is not None else None,
            scopes=tuple(auth.scopes),
            token_endpoint_auth_method=auth.token_endpoint_auth_method,
            signing_algorithm=auth.signing_algorithm,
        )
    return None


def _allowlisted_server(connection: Connection) -> McpServerConfig:
    allowed = connection.allowed(connection.mode)
    return McpServerConfig(
        name=connection.name,
        url=connection.url,
        required=connection.required,
        headers=dict(connection.headers),  # bearer auth is already its Authorization template
        connect_timeout=connection.connect_timeout,
        call_timeout=connection.call_timeout,
        tools=allowed,
        pin=connection.pin,
        era=connection.era,
    )


def intelligence_settings(raw: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """``intelligence: {url, model, key}`` as raw setting values by Config field.

    ``url`` (one, a list, or ``{env: NAME}`` entries) gives ``intelligence``; ``model`` only when written;
    ``key: {env: NAME}`` gives ``intelligence_token: {{secret:NAME}}`` (a reference, read at connect time).
    """
    spec = structure(raw, HostIntelligence, path="$.intelligence")
    urls = spec.url if isinstance(spec.url, list) else [spec.url]
    resolved: list[str] = []
    for index, url in enumerate(urls):
        where = "$.intelligence.url" + (f"[{index}]" if isinstance(spec.url, list) else "")
        if isinstance(url, EnvRef):
            if url.env not in env:
                raise ConfigError(f"environment variable {url.env} is not set @ {where}")
            resolved.append(env[url.env])
        else:
            resolved.append(url)
    settings: dict[str, Any] = {"intelligence": resolved}
    if "model" in raw:
        settings["model"] = spec.model
    if spec.key is not None:
        if spec.key.env not in env:
            raise ConfigError(f"environment variable {spec.key.env} is not set @ $.intelligence.key")
        settings["intelligence_token"] = spec.key.template()
    return settings


def check_version(raw: Any) -> str:
    return structure({"version": raw}, HostFile, path="$").version


def check_transcript(raw: Any) -> TranscriptSettings:
    """Checked so one host file serves ``agentd run`` too; plain agentd records no transcript."""
    return structure({"transcript": raw}, HostFile, path="$").transcript
