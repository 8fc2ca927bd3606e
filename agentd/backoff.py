"""Exponential backoff, the one formula every retry loop in agentd uses (a leaf: no agentd imports).

The MCP client's reconnects (with jitter on top), the daemon's restart governor, the intelligence
client's retries on one endpoint (with jitter, and at least a server's ``Retry-After``) and its circuit
breakers' cooldowns all wait ``base * 2**(attempt - 1)`` capped at ``cap``: attempt 1 waits ``base``, and
attempt 0 (nothing failed yet) waits nothing. Each caller owns its ``base`` and ``cap``.
"""

from __future__ import annotations


def exponential(attempt: int, base: float, cap: float) -> float:
    if attempt <= 0:
        return 0.0
    # The exponent is bounded so a long failure streak cannot overflow a float.
    return min(cap, base * 2.0 ** min(attempt - 1, 62))
