"""The egress guard: may agentd fetch a URL that a *peer* gave it, and at which address?

Operator endpoints (``--mcp``, ``--intelligence``, host connections) are trusted configuration. URLs that
come from peers are not: OAuth discovery results (protected-resource metadata, authorization-server
metadata, token and JWKS endpoints) and anything a later feature fetches on a peer's word. A hostile peer
would point them at the cloud metadata service (``169.254.169.254``), at the daemon's own loopback
services, or at the private network behind the daemon (server-side request forgery).

The decision (:func:`decide`) is pure: a URL, the addresses its host resolved to, the policy and whether
the operator endpoint that led here is itself on loopback, in; an :class:`Allowed` (with the address to
connect to) or a :class:`Refused` (with a stable reason) out. The rules:

* the URL is ``http``/``https`` with a host, and carries no userinfo, no control characters (CR/LF), no
  whitespace and no backslash;
* link-local and cloud metadata addresses (169.254.0.0/16, fe80::/10, fd00:ec2::254) are refused unless
  an ``egress.allow`` entry inside those ranges names them (a broad ``0.0.0.0/0`` does not);
* loopback (and the unspecified address) only when the operator endpoint is loopback, or an
  ``egress.allow`` entry inside the loopback range names it;
* private and other non-global ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7, ...) only when
  ``egress.allow`` contains them; multicast never;
* v4-mapped (``::ffff:a.b.c.d``) and NAT64 (``64:ff9b::a.b.c.d``) addresses are judged as the IPv4
  address they carry;
* every address the name resolves to must pass (a name that resolves to a public and a metadata address
  is refused), and the connection is *pinned* to the first: :func:`vet` resolves once and :func:`pin`
  rewrites the request to that address while TLS (SNI and certificate check) and ``Host`` keep the name,
  so a second DNS answer cannot move the connection after the check (DNS rebinding).

:func:`operator_refusal` is the one rule that also applies to operator endpoints: a metadata address
literal is refused at start-up unless ``egress.allow`` names it.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final, Literal

import attrs

if TYPE_CHECKING:
    import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

Reason = Literal[
    "bad_url", "scheme", "userinfo", "control_characters", "unresolvable", "metadata", "loopback", "private",
    "multicast",
]

#: Link-local and cloud instance-metadata ranges (AWS's IPv6 endpoint is fd00:ec2::254).
METADATA_NETWORKS: Final[tuple[IPNetwork, ...]] = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),
)
LOOPBACK_NETWORKS: Final[tuple[IPNetwork, ...]] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
    ipaddress.ip_network("0.0.0.0/8"),  # "this host": connecting to 0.0.0.0 reaches the local machine
    ipaddress.ip_network("::/128"),
)
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_FORBIDDEN_CHARACTERS: Final = frozenset("\\ ") | frozenset(chr(c) for c in (*range(0x20), 0x7F))

#: A resolver: (host, port) -> the addresses it resolves to, in preference order.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


@attrs.frozen
class EgressPolicy:
    """What the operator allows beyond public addresses (``egress.allow`` in the config file)."""

    allow: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_cidrs(cls, cidrs: Iterable[str]) -> EgressPolicy:
        """Raises ValueError naming the entry that is not a CIDR (or a single address)."""
        networks: list[IPNetwork] = []
        for cidr in cidrs:
            try:
                networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
            except ValueError:
                raise ValueError(f"not an address or CIDR: {cidr!r}") from None
        return cls(tuple(networks))

    def allows(self, address: IPAddress, *, within: Sequence[IPNetwork] | None = None) -> bool:
        """An allow entry contains ``address``; with ``within``, the entry must itself lie inside one of
        those ranges (an explicit allowance, not a catch-all)."""
        for network in self.allow:
            if network.version != address.version or address not in network:
                continue
            if within is None or any(
                inner.version == network.version and network.subnet_of(inner)  # type: ignore[arg-type]
                for inner in within
            ):
                return True
        return False


@attrs.frozen
class Allowed:
    """Fetch ``url`` by connecting to ``address`` (TLS and ``Host`` keep ``host``)."""

    url: str
    host: str
    address: str
    port: int


@attrs.frozen
class Refused:
    """Do not fetch. ``origin`` is ``scheme://host[:port]`` only (never a path, query or userinfo)."""

    origin: str
    reason: Reason
    detail: str = ""

    @property
    def message(self) -> str:
        return f"egress to {self.origin} refused ({self.reason}{': ' + self.detail if self.detail else ''})"


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url`` for messages: no userinfo, path or query; unprintable text
    dropped and the length capped, so a hostile URL cannot forge a log line."""
    import httpx

    clean = "".join(c for c in url if c not in _FORBIDDEN_CHARACTERS)
    try:
        parsed = httpx.URL(clean)
        host = parsed.host
        if ":" in host:
            host = f"[{host}]"
        text = f"{parsed.scheme}://{host}" + (f":{parsed.port}" if parsed.port else "")
    except (httpx.InvalidURL, ValueError, TypeError):
        text = "<unparsable URL>"
    return text[:200]


def parse_url(url: str) -> httpx.URL | Refused:
    """The syntactic rules; the URL is parsed the way the connection will parse it (httpx)."""
    import httpx

    if any(c in _FORBIDDEN_CHARACTERS for c in url):
        return Refused(origin_of(url), "control_characters", "CR, LF, whitespace or backslash in the URL")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        return Refused(origin_of(url), "bad_url")
    if parsed.scheme not in ("http", "https"):
        return Refused(origin_of(url), "scheme", "only http and https")
    if parsed.userinfo or "@" in parsed.netloc.decode("ascii", "replace"):
        return Refused(origin_of(url), "userinfo", "credentials in the URL")
    if not parsed.host:
        return Refused(origin_of(url), "bad_url", "no host")
    return parsed


def unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address a v4-mapped or NAT64 IPv6 address carries; others unchanged."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def classify_address(address: IPAddress, policy: EgressPolicy, *, loopback_ok: bool) -> Reason | None:
    """None when ``address`` may be reached, else why not."""
    address = unwrap(address)
    if any(address.version == n.version and address in n for n in METADATA_NETWORKS):
        return None if policy.allows(address, within=METADATA_NETWORKS) else "metadata"
    if any(address.version == n.version and address in n for n in LOOPBACK_NETWORKS):
        return None if loopback_ok or policy.allows(address, within=LOOPBACK_NETWORKS) else "loopback"
    if address.is_multicast:
        return "multicast"
    if not address.is_global:
        return None if policy.allows(address) else "private"
    return None


def decide(
    url: str, addresses: Sequence[str], policy: EgressPolicy, *, operator_loopback: bool
) -> Allowed | Refused:
    """The egress verdict for ``url`` whose host resolved to ``addresses`` (an IP-literal host needs none)."""
    parsed = parse_url(url)
    if isinstance(parsed, Refused):
        return parsed
    origin = origin_of(url)
    literal = _ip_literal(parsed.host)
    candidates = [parsed.host] if literal is not None else list(addresses)
    if not candidates:
        return Refused(origin, "unresolvable")
    for candidate in candidates:
        try:
            address = ipaddress.ip_address(candidate.split("%", 1)[0])
        except ValueError:
            return Refused(origin, "unresolvable", "the resolver returned a non-address")
        reason = classify_address(address, policy, loopback_ok=operator_loopback)
        if reason is not None:
            return Refused(origin, reason, f"{parsed.host} is {address}" if literal is None else "")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return Allowed(url, parsed.host, candidates[0].split("%", 1)[0], port)


def operator_refusal(url: str, policy: EgressPolicy) -> Refused | None:
    """For an operator endpoint whose host is an address literal: metadata ranges are refused unless
    allowed. Loopback and private addresses are the operator's choice."""
    try:
        host = urllib.parse.urlsplit(url).hostname or ""
    except ValueError:
        return None  # the endpoint checks report it
    literal = _ip_literal(host)
    if literal is None:
        return None
    reason = classify_address(literal, policy, loopback_ok=True)
    if reason == "metadata":
        return Refused(origin_of(url), "metadata")
    return None


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


async def system_resolver(host: str, port: int) -> Sequence[str]:
    """Resolve with ``trio.socket.getaddrinfo`` (the system resolver, off the event loop's thread)."""
    import trio

    try:
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    seen: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = str(sockaddr[0])
        if address not in seen:
            seen.append(address)
    return seen


async def vet(
    url: str, policy: EgressPolicy, *, operator_loopback: bool, resolver: Resolver = system_resolver
) -> Allowed | Refused:
    """Resolve ``url``'s host once and decide; an :class:`Allowed` carries the address to pin."""
    parsed = parse_url(url)
    if isinstance(parsed, Refused):
        return parsed
    addresses: Sequence[str] = ()
    if _ip_literal(parsed.host) is None:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        addresses = await resolver(parsed.host, port)
    return decide(url, addresses, policy, operator_loopback=operator_loopback)


def pin(request: httpx.Request, allowed: Allowed) -> httpx.Request:
    """Make ``request`` connect to the vetted address: the URL's host becomes the address, while the
    ``Host`` header (set when the request was built) and TLS's server name and certificate check keep the
    original name, so no second DNS lookup happens between the check and the connection."""
    if _ip_literal(allowed.host) is not None:
        return request
    request.headers.setdefault("Host", request.url.netloc.decode("ascii"))
    if request.url.scheme == "https":
        request.extensions = {**request.extensions, "sni_hostname": allowed.host}
    request.url = request.url.copy_with(host=allowed.address)
    return request


__all__ = (
    "METADATA_NETWORKS",
    "Allowed",
    "EgressPolicy",
    "Refused",
    "Resolver",
    "classify_address",
    "decide",
    "operator_refusal",
    "origin_of",
    "parse_url",
    "pin",
    "system_resolver",
    "unwrap",
    "vet",
)
