"""A2A peers in the configuration: ``--a2a-peer NAME=URL``, merged with the config file's ``a2a_peers:``.

A peer is declared exactly like an MCP server (the same entry shape: ``name``, ``url``, ``required``,
``headers`` with secrets by reference, ``tls``, ``connect_timeout``, ``call_timeout``) and obeys the same
endpoint rules, so it reuses :class:`~agentd.config.model.McpServerConfig` as its value. ``call_timeout``
bounds one whole delegation (the run's deadline still applies); its default is :data:`CALL_TIMEOUT`.
The file's list is loaded by :mod:`agentd.config.a2a_file` (only when a file has one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs

from agentd import defaults
from agentd.config.endpoints import check_endpoint, check_server_name, merge_declared
from agentd.config.model import McpServerConfig, TlsConfig
from agentd.errors import ConfigError

#: The bound on one delegation when the entry gives no ``call_timeout`` (seconds).
CALL_TIMEOUT: Final = defaults.A2A_CALL_TIMEOUT


def parse_peer_flag(value: str) -> tuple[str, str]:
    """Split and check one ``--a2a-peer name=<endpoint>``."""
    name, sep, url = value.partition("=")
    if not sep:
        raise ConfigError(f"--a2a-peer: missing '=' in {value!r} (expected name=<endpoint>)")
    name = name.strip()
    check_server_name(name, what="--a2a-peer")
    return name, check_endpoint(url, what=f"--a2a-peer {name}")


def merge_peers(from_file: Any, flags: Sequence[str], tls_ca: str | None) -> tuple[McpServerConfig, ...]:
    """File entries then ``--a2a-peer`` flags (the same name twice must agree on the URL); ``--tls-ca``
    is every https peer's CA unless its entry names its own."""
    peers = merge_declared(from_file or (), flags, flag="--a2a-peer", section="a2a_peers", kind="peer", parse=parse_peer_flag,
                           make=lambda name, url: McpServerConfig(name=name, url=url, call_timeout=CALL_TIMEOUT))
    out = []
    for peer in peers:
        if tls_ca is not None and peer.url.lower().startswith("https://") and (peer.tls is None or peer.tls.ca is None):
            peer = attrs.evolve(peer, tls=attrs.evolve(peer.tls, ca=tls_ca) if peer.tls else TlsConfig(ca=tls_ca))
        out.append(peer)
    return tuple(out)

