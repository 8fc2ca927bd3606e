"""The config-file layer: one YAML file with ``mcp_servers``, the host keys and any setting of the flag table.

::

    mcp_servers:                             # agentd.config.servers
      - name: fs
        url: https://mcp-fs.internal/mcp
        tls: {ca: certs/ca.pem}
    max_steps: 20                            # any flag marked "file" in the flag table, snake_case

A host file's keys are accepted too (``version``, ``intelligence: {url, model, key}``, ``connections:``,
``transcript``; agentd.config.host, docs/config.md): each connection becomes a server entry with its
tool allowlist, so plain ``agentd --config host.yaml`` runs what ``agentd run`` would.

The file is read by agentd.config.yaml_file and structured by agentd.config.structure, as every agentd file
is. Unknown keys are errors naming their path (``$.mcp_servers[0].hedaers``). Relative paths (TLS files,
``--serve-*`` files, ``{{secret-file:...}}``) are relative to the config file's directory.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any, Final

import attrs

from agentd.config import host
from agentd.config.argv import FLAGS_BY_DEST, FLAGS_BY_FILE_KEY, Flag
from agentd.config.egress import load_egress
from agentd.config.model import EgressConfig, EventSubscriptionConfig, McpServerConfig
from agentd.config.servers import load_servers, rebase, rebase_secret_files
from agentd.config.yaml_file import read_mapping
from agentd.errors import ConfigError
from agentd.prices import Price, parse_price_table


@attrs.frozen
class FileLayer:
    """What one config file says. ``settings`` are raw YAML values by Config field, converted in ``load``."""

    path: str
    settings: Mapping[str, tuple[Flag, Any]]
    mcp_servers: tuple[McpServerConfig, ...]
    #: ``a2a_peers:`` (agentd.config.a2a_file), shaped like ``mcp_servers`` entries.
    a2a_peers: tuple[McpServerConfig, ...] = ()
    #: ``egress:`` (agentd.config.egress), None when the file has no such section.
    egress: EgressConfig | None = None
    #: ``on_events:`` (agentd.config.on_events): the MCP events a reactive daemon wakes on.
    on_events: tuple[EventSubscriptionConfig, ...] = ()
    #: ``prices: {MODEL: {input, output}}`` (agentd.prices), dollars per million tokens as read.
    prices: Mapping[str, Price] = attrs.field(factory=dict)


#: The file's list sections besides the flags' keys.
_SECTIONS: Final = ("mcp_servers", "a2a_peers", "on_events")
#: A host file's own keys (agentd.config.host), accepted here so one host file serves both commands.
HOST_KEYS: Final = ("version", "connections", "transcript")


def load_file(path: str, env: Mapping[str, str] | None = None) -> FileLayer:
    """Read and check one config file (``env``: for the host keys' ``{env: NAME}`` references).

    Raises:
        ConfigError: unreadable or not YAML, not a mapping, an unknown key, or a bad ``mcp_servers`` or
            ``connections`` entry.
    """
    env = os.environ if env is None else env
    raw = read_mapping(path, "--config")
    base_dir = os.path.dirname(os.path.abspath(path))
    settings: dict[str, tuple[Flag, Any]] = {}
    servers: tuple[McpServerConfig, ...] = ()
    connections: tuple[McpServerConfig, ...] = ()
    peers: tuple[McpServerConfig, ...] = ()
    egress: EgressConfig | None = None
    on_events: tuple[EventSubscriptionConfig, ...] = ()
    prices: dict[str, Price] = {}
    for key, value in raw.items():
        try:
            if value is None and isinstance(key, str) and (key in _SECTIONS or key in FLAGS_BY_FILE_KEY):
                continue  # `key:` with nothing after it (everything commented out) means "not set"
            if key == "mcp_servers":
                servers = load_servers(value, base_dir)
            elif key == "a2a_peers":
                from agentd.config.a2a_file import load_peers

                peers = load_peers(value, base_dir)
            elif key == "egress":
                egress = load_egress(value)
            elif key == "on_events":
                from agentd.config.on_events import load_section

                on_events = load_section(value)
            elif key == "prices":
                prices = parse_price_table(value, "$.prices")
            elif key == "telemetry" and isinstance(value, dict):
                # ``telemetry: {otel: true, metrics_addr: ..., log_level: ...}``: the telemetry flags, grouped
                for sub, setting in value.items():
                    flag = FLAGS_BY_FILE_KEY.get(sub) if isinstance(sub, str) else None
                    if flag is None or flag.group != "telemetry":
                        raise ConfigError(f"unknown key {sub!r} @ $.telemetry.{sub}")
                    if setting is not None:
                        settings[flag.dest] = (flag, _rebase_setting(flag, setting, base_dir))
            elif key == "cluster" and isinstance(value, dict):
                # ``cluster: {dsn: ..., capacity: ..., lease_ttl: ...}``: the cluster flags, grouped
                for sub, setting in value.items():
                    name = "cluster" if sub == "dsn" else f"cluster_{sub}"
                    flag = FLAGS_BY_FILE_KEY.get(name) if isinstance(sub, str) and sub != "cluster" else None
                    if flag is None:
                        raise ConfigError(f"unknown key {sub!r} @ $.cluster.{sub}")
                    if setting is not None:
                        settings[flag.dest] = (flag, _rebase_setting(flag, setting, base_dir))
            elif key in HOST_KEYS or (key == "intelligence" and isinstance(value, dict)):
                connections = _host_key(key, value, env, settings, base_dir) or connections
            elif isinstance(key, str) and key in FLAGS_BY_FILE_KEY:
                flag = FLAGS_BY_FILE_KEY[key]
                settings[flag.dest] = (flag, _rebase_setting(flag, value, base_dir))
            else:
                raise ConfigError(f"unknown key {key!r} @ $.{key}{_suggest(key)}")
        except ConfigError as exc:
            raise ConfigError(f"--config {path}: {exc}") from None
    for index, server in enumerate(servers):
        if any(other.name == server.name for other in connections):
            raise ConfigError(
                f"--config {path}: connection {server.name!r} is declared twice "
                f"($.mcp_servers[{index}] and $.connections.{server.name})"
            )
    return FileLayer(path, settings, (*connections, *servers), peers, egress, on_events, prices)


def _host_key(
    key: str, value: Any, env: Mapping[str, str], settings: dict[str, tuple[Flag, Any]], base_dir: str
) -> tuple[McpServerConfig, ...] | None:
    """A host file's key: ``connections`` gives server entries; the others fill settings or are checked."""
    if key == "connections":
        return host.load_connections(value, env, base_dir)
    if key == "intelligence":
        for dest, raw in host.intelligence_settings(value, env).items():
            flag = FLAGS_BY_DEST[dest]
            settings[flag.dest] = (flag, raw)
    elif key == "version":
        host.check_version(value)
    else:
        host.check_transcript(value)
    return None


def _suggest(key: object) -> str:
    known = [*_SECTIONS, "egress", "prices", *HOST_KEYS, *FLAGS_BY_FILE_KEY]
    close = difflib.get_close_matches(str(key), known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _rebase_setting(flag: Flag, value: Any, base_dir: str) -> Any:
    if flag.kind == "path" and isinstance(value, str):
        return rebase(value, base_dir)
    if flag.kind == "secret" and isinstance(value, str):
        return rebase_secret_files(value, base_dir)
    return value
