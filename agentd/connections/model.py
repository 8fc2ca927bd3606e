"""The shapes of a host config and an agent manifest, as written (docs/connections.md).

Host config (``--config host.yaml``)::

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
    mcp_servers: [...]          # the earlier list; mapped into the same model (docs/config.md)
    transcript: {path: runs.sqlite3, dataPolicy: full, retentionDays: 30}

Agent manifest: ``connections: [{ref, alias, mode, tools, required}]``, ``limits`` and ``steps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from agentd.connections.structure import EnvRef, FieldError, converter, register_aliases, str_or_env

Mode = Literal["read", "read_write"]
DataPolicy = Literal["full", "redact_tool_values", "metadata_only"]


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
    connect_timeout_ms: int = attrs.field(default=10_000, alias="connectTimeoutMs")
    tool_timeout_ms: int = attrs.field(default=60_000, alias="toolTimeoutMs")


@attrs.frozen
class HostIntelligence:
    url: str | EnvRef | list[str | EnvRef]
    model: str = "default"
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
    """The host config file's own keys (``mcp_servers`` is structured by agentd.config, then mapped)."""

    version: str = "1.0"
    intelligence: HostIntelligence | None = None
    connections: dict[str, HostConnection] = attrs.field(factory=dict)
    transcript: TranscriptSettings = attrs.field(factory=TranscriptSettings)


def _url_list(value: Any, _: Any) -> str | EnvRef | list[str | EnvRef]:
    if isinstance(value, list):
        return [str_or_env(v) for v in value]
    return str_or_env(value)


converter.register_structure_hook(str | EnvRef | list[str | EnvRef], _url_list)


# --- manifest --------------------------------------------------------------------------------------------


@attrs.frozen
class Binding:
    ref: str
    alias: str | None = None
    mode: Mode | None = None
    tools: list[str] | None = None
    required: bool = True

    @property
    def name(self) -> str:
        """What the agent calls this connection: its alias, else the host's name."""
        return self.alias or self.ref


@attrs.frozen
class ManifestLimits:
    max_tool_calls_per_iteration: int | None = attrs.field(default=None, alias="maxToolCallsPerIteration")
    #: Model calls per step (each one followed by its tool calls).
    max_steps: int = attrs.field(default=50, alias="maxSteps")
    #: Tokens for the whole run (every step).
    max_tokens: int = attrs.field(default=200_000, alias="maxTokens")
    #: Wall clock for the whole run.
    deadline_ms: int = attrs.field(default=600_000, alias="deadlineMs")


@attrs.frozen
class Step:
    id: str
    prompt: str
    type: Literal["prompt"] = "prompt"
    tools: list[str] = attrs.field(factory=list)


@attrs.frozen
class Manifest:
    steps: list[Step]
    connections: list[Binding] = attrs.field(factory=list)
    limits: ManifestLimits = attrs.field(factory=ManifestLimits)
    version: str = "1.0"
    name: str | None = None
    #: The output contract of the last step (as ``--output-contract``).
    output: str | None = None


register_aliases(AuthClientCredentials, HostConnection, TranscriptSettings, ManifestLimits)
