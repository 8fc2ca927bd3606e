"""``mcp_servers:`` entries as written in a config or host file, checked and made into :class:`McpServerConfig`.

::

    mcp_servers:
      - name: fs
        url: https://mcp-fs.internal/mcp
        required: true                       # default
        headers: {Authorization: "Bearer {{secret:FS_TOKEN}}"}
        tls: {ca: certs/ca.pem, cert: certs/client.pem, key: certs/client.key}
        connect_timeout: 10s
        call_timeout: 60s
        tags: [sensitive_data]               # Rule of Two (docs/security.md); none: untrusted_input
        pin: {search: 3f1c...e9}             # or pin_file: fs.pins.yaml (docs/security.md, Catalogue pinning)
        era: auto                            # default; legacy | modern: speak only that era (docs/mcp-client.md)
        approve: [delete_file]               # a person approves each call first (docs/approvals.md)
        capabilities: [elicitation]          # opt in: elicitation, sampling, sampling.tools (docs/mcp-client.md); default none

Relative paths (TLS files, ``{{secret-file:...}}``) are relative to the file's directory.
"""

from __future__ import annotations

import os
import re
from typing import Any, Final

import attrs

from agentd import defaults
from agentd.config.model import McpServerConfig, TlsConfig, check_approve, check_capabilities, check_era
from agentd.config.structure import Duration, structure
from agentd.errors import ConfigError
from agentd.mcp.tool_hash import HASH_PATTERN

_CONNECT_TIMEOUT: Final = Duration(defaults.CONNECT_TIMEOUT)
_CALL_TIMEOUT: Final = Duration(defaults.CALL_TIMEOUT)


@attrs.frozen
class _TlsEntry:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


@attrs.frozen
class _ServerEntry:
    """``mcp_servers[]`` as written; converted to :class:`McpServerConfig` after structuring."""

    name: str
    url: str
    required: bool = True
    headers: dict[str, str] = attrs.field(factory=dict)
    tls: _TlsEntry | None = None
    connect_timeout: Duration = _CONNECT_TIMEOUT
    call_timeout: Duration = _CALL_TIMEOUT
    tags: list[str] | None = None
    pin: dict[str, str] | None = None
    pin_file: str | None = None
    era: str = defaults.MCP_ERA
    approve: list[str] | None = None
    capabilities: list[str] | None = None


def load_servers(raw: Any, base_dir: str, *, section: str = "mcp_servers", kind: str = "server",
                 call_timeout: float = defaults.CALL_TIMEOUT, tags: bool = True,
                 taggable: bool = False) -> tuple[McpServerConfig, ...]:
    """A list of server entries (``mcp_servers``, or another section of the same shape such as ``a2a_peers``
    with its own ``call_timeout`` default); a ConfigError names ``$.<section>[i]...``. ``tags=False`` refuses
    the MCP-only keys (``tags``, ``pin``, ``era``), except ``tags`` when ``taggable`` (A2A peers)."""
    if not isinstance(raw, list):
        raise ConfigError(f"expected a list of {kind}s @ $.{section}, got {type(raw).__name__}")
    from agentd.config.validate import check_server

    servers: list[McpServerConfig] = []
    for index, item in enumerate(raw):
        what = f"$.{section}[{index}]"
        if isinstance(item, dict) and "call_timeout" not in item:
            item = {**item, "call_timeout": call_timeout}
        entry = structure(item, _ServerEntry, path=what)
        if entry.tags is not None and not (tags or taggable):
            raise ConfigError(f"unknown key 'tags' @ {what} (tags are for MCP servers and A2A peers)")
        if (entry.pin is not None or entry.pin_file is not None) and not tags:
            raise ConfigError(f"unknown key 'pin' @ {what} (catalogue pins are for MCP servers)")
        if entry.era != defaults.MCP_ERA and not tags:
            raise ConfigError(f"unknown key 'era' @ {what} (protocol eras are for MCP servers)")
        if (entry.approve is not None or entry.capabilities is not None) and not tags:
            key = "approve" if entry.approve is not None else "capabilities"
            raise ConfigError(f"unknown key {key!r} @ {what} ({key} is for MCP servers)")
        tls = None
        if entry.tls is not None:
            tls = TlsConfig(*(rebase(p, base_dir) for p in (entry.tls.ca, entry.tls.cert, entry.tls.key)))
        headers = {name: rebase_secret_files(value, base_dir) for name, value in entry.headers.items()}
        server = McpServerConfig(
            name=entry.name,
            url=entry.url,
            required=entry.required,
            headers=headers,
            tls=tls,
            connect_timeout=entry.connect_timeout,
            call_timeout=entry.call_timeout,
            tags=None if entry.tags is None else tuple(entry.tags),
            pin=load_pins(entry.pin, entry.pin_file, base_dir, what) if tags else None,
            era=check_era(entry.era, f"{what}.era"),
            approve=check_approve(entry.approve or (), f"{what}.approve"),
            capabilities=check_capabilities(entry.capabilities or (), f"{what}.capabilities"),
        )
        check_server(server, what=what)
        if any(other.name == server.name for other in servers):
            raise ConfigError(f"{what}: duplicate {kind} name {server.name!r}")
        servers.append(server)
    return tuple(servers)


def load_pins(pin: dict[str, str] | None, pin_file: str | None, base_dir: str, what: str) -> dict[str, str] | None:
    """A server's (or host connection's) pinned tool hashes from ``pin:`` or ``pin_file:`` (one, not both),
    checked; None: unpinned. ``pin_file`` is relative to ``base_dir`` (the file's directory)."""
    if pin is not None and pin_file is not None:
        raise ConfigError(f"{what}: give 'pin' or 'pin_file', not both")
    if pin_file is not None:
        from agentd.config.yaml_file import read_mapping

        path = rebase(pin_file, base_dir) or pin_file
        raw: Any = read_mapping(path, f"{what}.pin_file")
        where = f"{what}.pin_file ({path})"
    elif pin is not None:
        raw, where = pin, f"{what}.pin"
    else:
        return None
    pins: dict[str, str] = {}
    for tool, digest in raw.items():
        if not isinstance(tool, str) or not isinstance(digest, str) or not HASH_PATTERN.fullmatch(digest):
            raise ConfigError(f"{where}: {tool!r} must map to a tool hash (64 lowercase hex digits, as "
                              f"'agentd check' prints it)")
        pins[tool] = digest
    return pins


def rebase(path: str | None, base_dir: str) -> str | None:
    """A path as written in a file, relative to ``base_dir`` (the file's directory); ``-`` and None kept."""
    if path is None or path == "-":
        return path
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(base_dir, path)


_SECRET_FILE: Final = re.compile(r"(\{\{\s*secret-file\s*:\s*)(.*?)(\s*\}\})")


def rebase_secret_files(template: str, base_dir: str) -> str:
    """Make ``{{secret-file:rel}}`` references relative to ``base_dir`` (the config file's directory)."""
    return _SECRET_FILE.sub(lambda m: f"{m[1]}{rebase(m[2], base_dir)}{m[3]}" if m[2] else m[0], template)

