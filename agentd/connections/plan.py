"""From a host config and a manifest to a validated plan, before any side effect.

Everything here is pure: files are read and checked, environment *references* are checked for presence
(never read into memory), and every problem names the exact path of the value at fault
(``$.connections[0].tools[1]``, ``$.steps[2].tools[0]``). ``ConfigError`` means exit 2.

The earlier ``mcp_servers[]`` list (and ``--mcp NAME=URL`` flags) load into the same
:class:`Connection` model as the ``connections:`` map: such an entry allows every tool its server lists
(``tools: None``), is ``read_write`` with no ``readTools``, and keeps its header templates and TLS
settings (docs/config.md, "Host connections").
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import yaml

from agentd.config.egress import load_egress
from agentd.config.model import EgressConfig, McpServerConfig, TlsConfig
from agentd.connections.model import (
    Auth,
    AuthBearer,
    AuthClientCredentials,
    AuthNone,
    Binding,
    HostConnection,
    HostFile,
    HostIntelligence,
    Manifest,
    Mode,
    TranscriptSettings,
)
from agentd.connections.structure import EnvRef, structure
from agentd.errors import ConfigError
from agentd.intelligence.names import SEPARATOR
from agentd.secrets import check_refs_available

_ALIAS: Final = re.compile(r"^[A-Za-z][A-Za-z0-9-]*(_[A-Za-z0-9-]+)*$")
_APP_TOOL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_CREDENTIAL_HEADER: Final = re.compile(r"(authorization|cookie|token|secret|api[-_]?key|password)", re.I)


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


@attrs.frozen
class BoundConnection:
    """A manifest binding resolved against the host: the alias the model sees and the tools it may use."""

    binding: Binding
    connection: Connection
    alias: str
    mode: Mode
    tools: tuple[str, ...] | None  # None: every tool the server lists

    def offers(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools

    def server_config(self, auth: object | None = None, http_client: object | None = None) -> McpServerConfig:
        return McpServerConfig(
            name=self.alias,
            url=self.connection.url,
            required=self.binding.required and self.connection.required,
            headers=dict(self.connection.headers),
            tls=self.connection.tls,
            connect_timeout=self.connection.connect_timeout,
            call_timeout=self.connection.call_timeout,
            auth=auth,
            http_client=http_client,
        )


@attrs.frozen
class Plan:
    host: Host
    manifest: Manifest
    bound: tuple[BoundConnection, ...]
    #: Optional bindings whose connection the host does not configure (skipped, not an error).
    skipped: tuple[str, ...] = ()

    def binding(self, alias: str) -> BoundConnection | None:
        return next((b for b in self.bound if b.alias == alias), None)


# --- files -----------------------------------------------------------------------------------------------


def read_yaml(path: str, what: str) -> Any:
    from agentd.config.file import _StrictLoader  # duplicate keys are errors, as in every agentd file

    try:
        with open(path, encoding="utf-8") as file:
            raw = yaml.load(file, Loader=_StrictLoader)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        detail = f" ({problem})" if isinstance(problem, str) else ""
        raise ConfigError(f"{what} {path}: not valid YAML{where}{detail}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} {path}: the top level must be a mapping @ $")
    return raw


def load_host(path: str | None, env: Mapping[str, str], *, mcp_flags: Sequence[McpServerConfig] = ()) -> Host:
    """The host config (``path`` may be None: only ``--mcp`` flags), checked completely."""
    raw: dict[str, Any] = read_yaml(path, "--config") if path is not None else {}
    base_dir = os.path.dirname(os.path.abspath(path)) if path is not None else os.getcwd()
    legacy_raw = raw.pop("mcp_servers", None)
    egress_raw = raw.pop("egress", None)
    prefix = f"--config {path}: " if path is not None else ""
    try:
        egress = load_egress(egress_raw)
        parsed = structure(raw, HostFile, path="$")
        connections: dict[str, Connection] = {}
        for name, entry in parsed.connections.items():
            connections[name] = _from_host_entry(name, entry, env, f"$.connections.{name}")
        legacy: tuple[McpServerConfig, ...] = ()
        if legacy_raw is not None:
            from agentd.config.file import _load_servers

            legacy = _load_servers(legacy_raw, base_dir)
        for source, servers in (("mcp_servers", legacy), ("--mcp", tuple(mcp_flags))):
            for index, server in enumerate(servers):
                where = f"$.mcp_servers[{index}]" if source == "mcp_servers" else f"--mcp {server.name}"
                if server.name in connections:
                    raise ConfigError(f"{where}: connection {server.name!r} is declared twice")
                for template in server.headers.values():
                    _refs_present(template, env, where)
                connections[server.name] = _from_server(server, source)
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


def _from_host_entry(name: str, entry: HostConnection, env: Mapping[str, str], where: str) -> Connection:
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


def _from_server(server: McpServerConfig, source: str) -> Connection:
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
    )


def load_manifest(path: str) -> Manifest:
    raw = read_yaml(path, "manifest")
    try:
        return structure(raw, Manifest, path="$")
    except ConfigError as exc:
        raise ConfigError(f"manifest {path}: {exc}") from None


# --- binding ---------------------------------------------------------------------------------------------


def bind(
    host: Host, manifest: Manifest, *, application_tools: Sequence[str] = (), manifest_path: str = ""
) -> Plan:
    """Check the manifest against the host and the runtime module's tools; every problem at once."""
    problems: list[str] = []
    bound: list[BoundConnection] = []
    skipped: list[str] = []
    aliases: set[str] = set()
    for index, binding in enumerate(manifest.connections):
        where = f"$.connections[{index}]"
        alias = binding.name
        if not _ALIAS.match(alias) or SEPARATOR in alias:
            problems.append(
                f"alias {alias!r} must start with a letter and use letters, digits, '-' and single '_' "
                f"(never '__', the tool-name separator) @ {where}.{'alias' if binding.alias else 'ref'}"
            )
            continue
        if alias in aliases:
            problems.append(f"alias {alias!r} is bound twice @ {where}")
            continue
        aliases.add(alias)
        connection = host.connections.get(binding.ref)
        if connection is None:
            if binding.required:
                configured = ", ".join(sorted(host.connections)) or "none"
                problems.append(
                    f"required connection {binding.ref!r} is not configured by the host (configured: {configured}) "
                    f"@ {where}.ref"
                )
            else:
                skipped.append(alias)
            continue
        mode: Mode = binding.mode or connection.mode
        if mode == "read_write" and connection.mode == "read":
            problems.append(
                f"connection {binding.ref!r} is read-only on the host; a binding cannot elevate read to "
                f"read_write @ {where}.mode"
            )
            continue
        allowed = connection.allowed(mode)
        tools: tuple[str, ...] | None = allowed
        if binding.tools is not None:
            for t_index, tool in enumerate(binding.tools):
                at = f"{where}.tools[{t_index}]"
                if connection.tools is not None and tool not in connection.tools:
                    problems.append(
                        f"tool {tool!r} is not in the host's allowlist for {binding.ref!r} @ {at}"
                    )
                elif allowed is not None and tool not in allowed:
                    problems.append(
                        f"tool {tool!r} is not classified read-only (readTools) for {binding.ref!r}; a read binding "
                        f"cannot offer it @ {at}"
                    )
            tools = tuple(binding.tools)
        bound.append(BoundConnection(binding, connection, alias, mode, tools))
    app = set(application_tools)
    for name in sorted(app):
        if not _APP_TOOL.match(name):
            problems.append(
                f"application tool {name!r} must match {_APP_TOOL.pattern} @ runtime module tool_adapter"
            )
        head = name.split(SEPARATOR, 1)[0] if SEPARATOR in name else None
        if head is not None and (head in aliases or head in skipped):
            problems.append(
                f"application tool {name!r} clashes with the tools of connection alias {head!r} "
                "@ runtime module tool_adapter"
            )
    ids: set[str] = set()
    if not manifest.steps:
        problems.append("a manifest needs at least one step @ $.steps")
    for s_index, step in enumerate(manifest.steps):
        if step.id in ids:
            problems.append(f"step id {step.id!r} is used twice @ $.steps[{s_index}].id")
        ids.add(step.id)
        for t_index, name in enumerate(step.tools):
            at = f"$.steps[{s_index}].tools[{t_index}]"
            problem = _step_tool_problem(name, bound, skipped, app)
            if problem is not None:
                problems.append(f"{problem} @ {at}")
    limits = manifest.limits
    for value, key in ((limits.max_steps, "maxSteps"), (limits.deadline_ms, "deadlineMs")):
        if value < 1:
            problems.append(f"{key} must be at least 1 @ $.limits.{key}")
    if limits.max_tool_calls_per_iteration is not None and limits.max_tool_calls_per_iteration < 1:
        problems.append("maxToolCallsPerIteration must be at least 1 @ $.limits.maxToolCallsPerIteration")
    if problems:
        prefix = f"manifest {manifest_path}: " if manifest_path else ""
        raise ConfigError(prefix + "; ".join(problems))
    return Plan(host, manifest, tuple(bound), tuple(skipped))


def _step_tool_problem(
    name: str, bound: Sequence[BoundConnection], skipped: Sequence[str], app: set[str]
) -> str | None:
    if name in app:
        return None
    if SEPARATOR in name:
        alias, tool = name.split(SEPARATOR, 1)
        binding = next((b for b in bound if b.alias == alias), None)
        if binding is not None:
            if binding.offers(tool):
                return None
            offered = ", ".join(binding.tools or ()) or "nothing"
            return f"step tool {name!r}: binding {alias!r} does not provide {tool!r} (it offers: {offered})"
        if alias in skipped:
            return None  # an optional connection the host does not configure: absent at run time
    return f"step tool {name!r} is provided by no binding and no application tool"
