"""Which proxy, if any, an outgoing request goes through: ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` and
``NO_PROXY``, read once per client, decided per request as data.

Why not httpx's ``trust_env=True``: it would also read ``.netrc`` (credentials nobody configured for
agentd) and ``SSL_CERT_FILE`` in its own way, and it proxies loopback unless ``NO_PROXY`` says otherwise.
Here loopback (``localhost``, ``127.0.0.0/8``, ``::1``) is never proxied, whatever the environment says:
a local MCP server or gateway sent to a corporate proxy would fail, or leak what it carries.

``NO_PROXY`` follows the common convention: comma- or space-separated entries, each a host name (which also
matches its subdomains; a leading ``.`` or ``*.`` is ignored), an IP address, a CIDR block, optionally with
``:port``; ``*`` alone disables proxying. A proxy given as a bare ``host:port`` is an ``http://`` proxy.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Mapping

import attrs

from agentd.security.loopback import is_loopback_host


def _get(environ: Mapping[str, str], name: str) -> str:
    return (environ.get(name.lower()) or environ.get(name.upper()) or "").strip()


def _proxy(environ: Mapping[str, str], name: str) -> str | None:
    value = _get(environ, name)
    if not value:
        return None
    return value if "://" in value else f"http://{value}"  # curl's convention: a bare host:port is http


@attrs.frozen
class ProxyEnv:
    """The proxy settings of one environment. ``https``/``http`` are proxy URLs or None."""

    https: str | None = None
    http: str | None = None
    no_proxy: tuple[str, ...] = ()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ProxyEnv:
        every = _proxy(environ, "ALL_PROXY")
        exempt = _get(environ, "NO_PROXY")
        entries = tuple(e.strip().lower() for e in exempt.replace(" ", ",").split(",") if e.strip())
        return cls(_proxy(environ, "HTTPS_PROXY") or every, _proxy(environ, "HTTP_PROXY") or every, entries)

    @property
    def active(self) -> bool:
        return bool(self.https or self.http) and "*" not in self.no_proxy

    def proxy_for(self, url: str) -> str | None:
        """The proxy URL for a request to ``url``, or None to connect directly."""
        parts = urllib.parse.urlsplit(url)
        host = (parts.hostname or "").lower().rstrip(".")
        proxy = self.https if parts.scheme.lower() == "https" else self.http
        if proxy is None or not host or is_loopback_host(host):
            return None
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
        return None if any(_exempts(entry, host, port) for entry in self.no_proxy) else proxy


def _exempts(entry: str, host: str, port: int) -> bool:
    if entry == "*":
        return True
    if entry.startswith("[") and "]" in entry:  # [::1]:8080
        addr, _, rest = entry[1:].partition("]")
        entry_host, entry_port = addr, rest.lstrip(":")
    elif entry.count(":") == 1:
        entry_host, entry_port = entry.split(":")
    else:
        entry_host, entry_port = entry, ""
    if entry_port and entry_port != str(port):
        return False
    try:
        network = ipaddress.ip_network(entry_host, strict=False)
    except ValueError:
        name = entry_host.removeprefix("*").lstrip(".")
        return bool(name) and (host == name or host.endswith("." + name))
    try:
        return ipaddress.ip_address(host.strip("[]")) in network
    except ValueError:
        return False
