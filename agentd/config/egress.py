"""The ``egress:`` config-file section: which non-public addresses peer-supplied URLs may reach.

::

    egress:
      allow: [10.20.0.0/16, 169.254.169.254/32]

The decision itself lives in :mod:`agentd.transport.egress`; this module only reads and checks the
section (no httpx, so ``--validate-config`` stays light).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from agentd.config.model import EgressConfig
from agentd.errors import ConfigError


def load_egress(raw: Any, _base_dir: str = "") -> EgressConfig:
    """``egress: {allow: [cidr, ...]}`` -> :class:`EgressConfig`; errors name the path."""
    if raw is None:
        return EgressConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a mapping @ $.egress, got {type(raw).__name__}")
    for key in raw:
        if key != "allow":
            raise ConfigError(f"unknown key {key!r} @ $.egress.{key} (expected allow)")
    allow = raw.get("allow") or []
    if isinstance(allow, str):
        allow = [allow]
    if not isinstance(allow, list):
        raise ConfigError(f"expected a list of CIDRs @ $.egress.allow, got {type(allow).__name__}")
    return EgressConfig(tuple(check_cidr(item, f"$.egress.allow[{i}]") for i, item in enumerate(allow)))


def check_cidr(value: Any, where: str) -> str:
    """A CIDR (or one address) in its normalized text form."""
    if not isinstance(value, str):
        raise ConfigError(f"expected a CIDR string @ {where}, got {type(value).__name__}")
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise ConfigError(f"not an address or CIDR: {value!r} @ {where}") from None
