"""The config file's ``a2a_peers:`` list: entries shaped like ``mcp_servers`` (agentd.config.servers).

:mod:`agentd.config.file` calls :func:`load_peers` when a file has the key (cattrs only then).
"""

from __future__ import annotations

from typing import Any

import attrs

from agentd import defaults
from agentd.config.a2a import CALL_TIMEOUT
from agentd.config.model import McpServerConfig, TlsConfig
from agentd.config.servers import rebase, rebase_secret_files
from agentd.config.structure import Duration, structure
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
    connect_timeout: Duration = Duration(defaults.CONNECT_TIMEOUT)  # noqa: RUF009
    call_timeout: Duration = Duration(CALL_TIMEOUT)  # noqa: RUF009


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
            tls = TlsConfig(*(rebase(p, base_dir) for p in (entry.tls.ca, entry.tls.cert, entry.tls.key)))
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

