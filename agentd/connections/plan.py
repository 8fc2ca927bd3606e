"""From a host config and a manifest to a validated plan, before any side effect.

Everything here is pure: the host config is read and checked by agentd.config.host (``load_host``), the
manifest here, and :func:`bind` checks one against the other; every problem names the exact path of the
value at fault (``$.connections[0].tools[1]``, ``$.steps[2].tools[0]``). ``ConfigError`` means exit 2.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

import attrs

from agentd.config.host import ALIAS, Connection, Host, Mode
from agentd.config.model import McpServerConfig
from agentd.config.structure import structure
from agentd.config.yaml_file import read_mapping
from agentd.connections.model import Binding, Manifest
from agentd.errors import ConfigError
from agentd.formats.tool_separator import SEPARATOR

_APP_TOOL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


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
            # The binding's allowlist narrows the connection itself (as plain agentd's connections do), so
            # a pin is checked against exactly the tools this run may use.
            tools=self.tools,
            pin=self.connection.pin,
            era=self.connection.era,
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


# --- files ---------------------------------------------------------------------------------------------


def load_manifest(path: str) -> Manifest:
    raw = read_mapping(path, "manifest")
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
        if not ALIAS.match(alias) or SEPARATOR in alias:
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
