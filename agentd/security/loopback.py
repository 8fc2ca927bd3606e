"""Which host names are this machine: the one rule that decides where ``http://`` is allowed, what a listener
may serve without authentication, what is never proxied, and where a peer-supplied URL may point.

A leaf, so the config checks, the transport and the egress guard all use the same answer.
"""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` (and ``*.localhost``), 127.0.0.0/8 and ::1 (brackets allowed); other names are not."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
