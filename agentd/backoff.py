"""Exponential backoff, the one formula every retry loop in agentd uses (a leaf: no agentd imports).

The MCP client's reconnects (with jitter on top) and the daemon's restart governor both wait
``base * 2**(attempt - 1)`` capped at ``cap``: attempt 1 waits ``base``, and attempt 0 (nothing failed
yet) waits nothing.
"""

from __future__ import annotations


def exponential(attempt: int, base: float, cap: float) -> float:
    if attempt <= 0:
        return 0.0
    # The exponent is bounded so a long failure streak cannot overflow a float.
    return min(cap, base * 2.0 ** min(attempt - 1, 62))
