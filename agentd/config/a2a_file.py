"""The config file's ``a2a_peers:`` section (an extension section of :mod:`agentd.config.file`).

Importing this module registers the loader; :mod:`agentd.config.load` does so whenever it reads a file.
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from agentd.config.a2a import CALL_TIMEOUT
from agentd.config.file import SECTIONS, Duration, rebase_secret_files, structure
from agentd.config.model import McpServerConfig, TlsConfig
from agentd.errors import ConfigError


@attrs.frozen
class _Tls:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


@attrs.frozen
class _PeerEntry:
    """``a2a_peers[]`` as written (the ``mcp_servers`` entry shape, with this module's call timeout)."""

    name: str
    url: str
    required: bool = True
    headers: dict[str, str] = attrs.field(factory=dict)
    tls: _Tls | None = None
    connect_timeout: Duration = Duration(float(attrs.fields(McpServerConfig).connect_timeout.default or 0))  # noqa: RUF009
    call_timeout: Duration = Duration(CALL_TIMEOUT)  # noqa: RUF009


def _rebase(path: str | None, base_dir: str) -> str | None:
    if path is None or path == "-":
        return path
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(base_dir, path)


def load_peers(raw: Any, base_dir: str) -> tuple[McpServerConfig, ...]:
    """The ``a2a_peers:`` section: a list of entries shaped like ``mcp_servers`` entries."""
    from agentd.config.validate import check_server

    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"expected a list of peers @ $.a2a_peers, got {type(raw).__name__}")
    peers: list[McpServerConfig] = []
    for index, item in enumerate(raw):
        what = f"$.a2a_peers[{index}]"
        entry = structure(item, _PeerEntry, path=what)
        tls = None
        if entry.tls is not None:
            tls = TlsConfig(*(_rebase(p, base_dir) for p in (entry.tls.ca, entry.tls.cert, entry.tls.key)))
        peer = McpServerConfig(
            name=entry.name, url=entry.url, required=entry.required,
            headers={k: rebase_secret_files(v, base_dir) for k, v in entry.headers.items()},
            tls=tls, connect_timeout=entry.connect_timeout, call_timeout=entry.call_timeout,
        )  # fmt: skip
        check_server(peer, what=what)
        if any(other.name == peer.name for other in peers):
            raise ConfigError(f"{what}: duplicate peer name {peer.name!r}")
        peers.append(peer)
    return tuple(peers)


SECTIONS.setdefault("a2a_peers", load_peers)
