"""Which URLs agentd will talk to: ``https://host[:port][/path]``, or ``http://`` on a loopback host only.

The rule is checked at start-up for every endpoint (``--mcp``, ``--intelligence``, ``--serve-mcp``), so a
typo or an accidental plain-text hop over the network is exit 2 before any socket is opened. Endpoints are
trusted configuration: they are never built from model- or server-supplied text.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from agentd.deferred.patterns import Pattern
from agentd.errors import ConfigError
from agentd.formats.tool_separator import SEPARATOR
from agentd.security.loopback import is_loopback_host as is_loopback_host

if TYPE_CHECKING:
    from agentd.config.model import McpServerConfig

#: The offline deterministic model: accepted wherever an intelligence endpoint is.
OFFLINE_MODEL: Final = "test"

#: Server names become tool-name prefixes (``<server>__<tool>``) and handles in logs, so keep them tame.
_SERVER_NAME: Final = Pattern(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_endpoint(url: str, *, what: str, listen: bool = False) -> str:
    """Return ``url`` if agentd may connect to it, else raise :class:`ConfigError` naming ``what`` and ``url``.

    Credentials in the URL (``https://user:pw@host``) are refused: they would end up in logs and errors.
    ``listen=True`` is for ``--serve-mcp``: port 0 (an ephemeral port) is allowed there.
    """
    if not url or url != url.strip() or any(c in url for c in "\r\n\t "):
        raise ConfigError(f"{what}: invalid endpoint {url!r} (empty or contains whitespace)")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{what}: invalid endpoint {url!r} ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise ConfigError(f"{what}: endpoint {url!r} must use https:// (or http:// on a loopback host)")
    host = parts.hostname
    if not host:
        raise ConfigError(f"{what}: endpoint {url!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{what}: endpoint must not carry credentials in the URL (host {host!r})")
    if port == 0 and not listen:
        raise ConfigError(f"{what}: endpoint {url!r} has port 0")
    if parts.fragment:
        raise ConfigError(f"{what}: endpoint {url!r} must not have a #fragment")
    if scheme == "http" and not is_loopback_host(host):
        raise ConfigError(
            f"{what}: plain http:// to non-loopback host {host!r} in {url!r}; use https:// "
            "(http:// is allowed only for 127.0.0.0/8, ::1 and localhost)"
        )
    return url


def check_intelligence_endpoint(url: str, *, what: str = "--intelligence") -> str:
    """Like :func:`check_endpoint`, plus the offline model ``test``; ``what`` names where the URL was written."""
    if url == OFFLINE_MODEL:
        return url
    return check_endpoint(url, what=what)


def split_endpoints(value: str) -> tuple[str, ...]:
    """``a,b , c`` → ``("a", "b", "c")``; an empty item is an error (it is always a typo)."""
    items = tuple(item.strip() for item in value.split(","))
    if not value.strip() or any(not item for item in items):
        raise ConfigError(f"--intelligence: empty endpoint in {value!r}")
    return items


def check_server_name(name: str, *, what: str = "--mcp") -> str:
    if not name:
        raise ConfigError(f"{what}: empty server name")
    if not _SERVER_NAME.match(name) or SEPARATOR in name:
        raise ConfigError(
            f"{what}: bad server name {name!r} (letters, digits, '_', '-', '.', at most 64, no '__')"
        )
    return name


def parse_mcp_flag(value: str) -> tuple[str, str]:
    """Split and check one ``--mcp name=<endpoint>``."""
    name, sep, url = value.partition("=")
    if not sep:
        raise ConfigError(f"--mcp: missing '=' in {value!r} (expected name=<endpoint>)")
    name = name.strip()
    check_server_name(name)
    return name, check_endpoint(url, what=f"--mcp {name}")


def merge_declared(
    from_file: Sequence[McpServerConfig], flags: Sequence[str], *, flag: str, section: str, kind: str,
    parse: Callable[[str], tuple[str, str]], make: Callable[[str, str], McpServerConfig],
) -> tuple[McpServerConfig, ...]:
    """File entries then ``FLAG name=url`` values (``--mcp``, ``--a2a-peer``): one rule for both.

    A name given twice by flags is an error; a flag naming a file entry must agree on its URL, and then the file's
    entry (headers, TLS, timeouts) is the one kept.
    """
    declared: dict[str, McpServerConfig] = {}
    for entry in from_file:
        if entry.name in declared:
            raise ConfigError(f"{section}: duplicate {kind} name {entry.name!r}")
        declared[entry.name] = entry
    seen: set[str] = set()
    for value in flags:
        name, url = parse(value)
        if name in seen:
            raise ConfigError(f"{flag}: duplicate {kind} name {name!r}")
        seen.add(name)
        if name in declared:
            if declared[name].url != url:
                raise ConfigError(f"{flag} {name}={url} conflicts with the config file's {section} entry {name!r} "
                                  f"({declared[name].url})")
            continue
        declared[name] = make(name, url)
    return tuple(declared.values())
