"""Which intelligence URLs are acceptable, and where exactly the request goes.

The rules are the ones every endpoint obeys (``agentd.config.endpoints``): https anywhere, plain http only
on loopback (127.0.0.0/8, ::1, ``localhost``), never credentials in the URL. ``test`` names the offline
model and must stand alone.

The original agentd POSTed to the URL path verbatim (``https://gw/v1`` went to ``/v1``). agentd treats the
URL as a *base*: ``<base>/chat/completions``, unless it already ends in ``/chat/completions``; a bare host
(no path, or ``/``) means the usual ``/v1/chat/completions``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from agentd.config.endpoints import OFFLINE_MODEL, check_endpoint
from agentd.errors import ConfigError

#: The name that selects the offline deterministic model instead of a gateway.
OFFLINE: Final = OFFLINE_MODEL

_SUFFIX: Final = "/chat/completions"


def completions_url(endpoint: str) -> str:
    """The exact URL to POST to for ``endpoint``; raises :class:`ConfigError` if it breaks the rules."""
    check_endpoint(endpoint, what="--intelligence")
    parts = urlsplit(endpoint)
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1" + _SUFFIX
    elif not path.endswith(_SUFFIX):
        path += _SUFFIX
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def parse_endpoints(endpoints: Iterable[str] | str) -> list[str]:
    """Normalise a comma list (or sequence) of endpoints; ``["test"]`` stays ``["test"]``."""
    items = (
        endpoints.split(",")
        if isinstance(endpoints, str)
        else [piece for entry in endpoints for piece in entry.split(",")]
    )
    cleaned = [item.strip() for item in items if item.strip()]
    if not cleaned:
        raise ConfigError("no intelligence endpoint given (--intelligence URL[,URL...] or 'test')")
    if OFFLINE in cleaned:
        if len(cleaned) > 1:
            raise ConfigError("the offline model 'test' cannot be combined with other intelligence endpoints")
        return [OFFLINE]
    return [completions_url(item) for item in cleaned]


def display(url: str) -> str:
    """A URL safe for logs and errors: scheme, host, port and path only (no query, no userinfo)."""
    return _display(url)


@functools.lru_cache(maxsize=64)  # an endpoint is displayed in every call's events: parsed once
def _display(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid URL>"
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))
