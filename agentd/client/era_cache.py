"""Which origins are known to speak only the 2026-07-28 wire, so later connections skip the refused initialize.

The first connection that learns "modern-only" (``initialize`` refused the modern way, then ``server/discover``
succeeded) records the origin (scheme, host, port). A later connection to that origin — a reconnect, or a pool
opened later in the same process — goes straight to ``server/discover``. The entry is a hint, never trusted
blindly: if discover then fails with anything but a network error (the server now answers like a legacy one),
the entry is dropped and the connection probes again with ``initialize``, exactly as on a cold start. Network
errors are no verdict: the entry stays.

Why a process-wide default: the verdict is a fact about the server behind an origin, not about a run, and the
daemon and the reactive modes open many pools per process. Because every use is verified, a stale or foreign
entry costs at most one request and can never put a legacy-only server on the wrong wire. Callers that want
isolation (tests counting requests, hosts embedding several independent agents) pass their own
:class:`EraCache` to ``open_mcp_pool(eras=...)``; :meth:`EraCache.forget` and :meth:`EraCache.clear` are the
explicit invalidation.
"""

from __future__ import annotations

import urllib.parse

_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> str:
    """``scheme://host:port`` of an endpoint, lower-cased, with the default port filled in."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    return f"{scheme}://{host}:{port}"


class EraCache:
    """Origins known to be modern-only (2026-07-28, no ``initialize``), with the version discover chose.
    (A plain class: the process's cache is built when the pool module loads, at a once run's start-up.)"""

    __slots__ = ("_modern",)

    def __init__(self) -> None:
        self._modern: dict[str, str] = {}

    def modern(self, url: str) -> str | None:
        """The protocol version recorded for ``url``'s origin, or None when nothing is known."""
        return self._modern.get(origin(url))

    def record_modern(self, url: str, protocol_version: str) -> None:
        self._modern[origin(url)] = protocol_version

    def forget(self, url: str) -> bool:
        """Drop ``url``'s origin (the assumption failed); True if there was an entry."""
        return self._modern.pop(origin(url), None) is not None

    def clear(self) -> None:
        self._modern.clear()

    def __len__(self) -> int:
        return len(self._modern)


_PROCESS = EraCache()


def process_era_cache() -> EraCache:
    """The per-process cache ``open_mcp_pool`` uses when its caller passes none."""
    return _PROCESS
