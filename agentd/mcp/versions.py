"""Protocol revisions and the two eras they fall into.

*Legacy* revisions (up to 2025-11-25) open with the ``initialize`` handshake and may use sessions;
*modern* ones (2026-07-28 and later) carry the version in every request's ``_meta`` and have no
sessions, no GET stream and no ``initialize`` (see docs/protocol.md).
"""

from __future__ import annotations

import enum
from typing import Final

#: Handshake revisions agentd speaks, newest first. The client offers the first one.
LEGACY_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
#: Revisions without a handshake, newest first.
MODERN_VERSIONS: Final = ("2026-07-28",)
LATEST_LEGACY: Final = LEGACY_VERSIONS[0]
LATEST_MODERN: Final = MODERN_VERSIONS[0]
#: What a server assumes when a legacy request carries no ``MCP-Protocol-Version`` header.
DEFAULT_HEADERLESS_VERSION: Final = "2025-03-26"
#: Every revision a dual-era endpoint accepts, newest first: the modern ones in the ``_meta`` envelope, the
#: handshake ones through ``initialize``. ``server/discover`` (``supportedVersions``) and ``-32022``
#: (``data.supported``) both name exactly these, so a refusal never names a version discover does not.
SUPPORTED_VERSIONS: Final = MODERN_VERSIONS + LEGACY_VERSIONS

#: Methods that exist only on the handshake wire; the modern wire answers them HTTP 404 with -32601.
LEGACY_ONLY: Final = frozenset({"initialize", "ping", "resources/subscribe", "resources/unsubscribe", "logging/setLevel"})
#: Methods that exist only on the modern wire.
MODERN_ONLY: Final = frozenset({"server/discover", "subscriptions/listen"})


class Era(enum.Enum):
    LEGACY = "legacy"
    MODERN = "modern"


def era_of(version: str) -> Era | None:
    if version in LEGACY_VERSIONS:
        return Era.LEGACY
    if version in MODERN_VERSIONS:
        return Era.MODERN
    return None


def request_era(header_version: str | None) -> Era:
    """The era a request to a dual-era endpoint belongs to, from its ``MCP-Protocol-Version`` header.

    The official SDK's rule: no header, or a handshake revision, is legacy; any other value is modern
    (an unknown one is then refused there with -32022, naming :data:`SUPPORTED_VERSIONS`).
    """
    return Era.MODERN if header_version is not None and header_version not in LEGACY_VERSIONS else Era.LEGACY


def server_pick_legacy(requested: str) -> str:
    """The version a legacy server answers ``initialize`` with: the client's if known, else the latest."""
    return requested if requested in LEGACY_VERSIONS else LATEST_LEGACY


def allows_batches(version: str) -> bool:
    """JSON-RPC batches exist only in 2025-03-26 (added there, removed in 2025-06-18)."""
    return version == "2025-03-26"


def has_structured_output(version: str) -> bool:
    return version not in ("2025-03-26", "2024-11-05")
