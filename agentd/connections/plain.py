"""The host config's keys as plain ``agentd --config host.yaml`` reads them (docs/config.md, "Host files").

One host file serves both ``agentd run`` and plain ``agentd``: its ``connections:`` map becomes ordinary
MCP server entries (the connection's name is the prefix the model sees, ``name__tool``), each carrying
the tools its ``mode`` allows as :attr:`McpServerConfig.tools`; its ``intelligence: {url, model, key}``
mapping becomes the ``intelligence``, ``model`` and ``intelligence_token`` settings. The checks are the
ones ``agentd run`` makes (agentd.connections.plan), with the same paths, so an error names the exact
value and the process exits 2 before it opens anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentd.config.model import McpServerConfig
from agentd.connections.model import (
    AuthClientCredentials,
    AuthOAuth,
    HostFile,
    HostIntelligence,
    TranscriptSettings,
)
from agentd.connections.plan import _ALIAS, Connection, _from_host_entry
from agentd.connections.structure import EnvRef, structure
from agentd.errors import ConfigError
from agentd.tool_separator import SEPARATOR


def load_connections(raw: Any, env: Mapping[str, str]) -> tuple[McpServerConfig, ...]:
    """``connections:`` as server entries with their allowlists (ConfigError naming the path)."""
    parsed = structure({"connections": raw}, HostFile, path="$")
    servers: list[McpServerConfig] = []
    for name, entry in parsed.connections.items():
        where = f"$.connections.{name}"
        if not _ALIAS.match(name) or SEPARATOR in name:
            raise ConfigError(
                f"connection name {name!r} must start with a letter and use letters, digits, '-' and single '_' "
                f"(never '__', the tool-name separator) @ {where}"
            )
        if isinstance(entry.auth, AuthOAuth | AuthClientCredentials):
            raise ConfigError(
                f"auth type {entry.auth.type} needs the host's runtime module or a token exchange, which only "
                f"'agentd run MANIFEST --config ...' provides; plain agentd supports none and bearer @ {where}.auth"
            )
        servers.append(_server(_from_host_entry(name, entry, env, where)))
    return tuple(servers)


def _server(connection: Connection) -> McpServerConfig:
    allowed = connection.allowed(connection.mode)
    return McpServerConfig(
        name=connection.name,
        url=connection.url,
        required=connection.required,
        headers=dict(connection.headers),  # bearer auth is already its Authorization template
        connect_timeout=connection.connect_timeout,
        call_timeout=connection.call_timeout,
        tools=allowed,
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
