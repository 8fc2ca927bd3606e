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
* IPv6 addresses that carry an IPv4 address are judged as that IPv4 address, before any connection:
  v4-mapped (``::ffff:a.b.c.d``), IPv4-compatible (``::a.b.c.d``, the deprecated ``::/96``, which Linux
  still routes to the IPv4 address), IPv4-translated (``::ffff:0:a.b.c.d``), NAT64 (``64:ff9b::/96`` and
  the local-use ``64:ff9b:1::/48``) and 6to4 (``2002:a.b.c.d::/48``, whose relay reaches the IPv4 address);
  Teredo (``2001::/32``) is never global and so needs ``egress.allow`` like any private range;
* every address the name resolves to must pass (a name that resolves to a public and a metadata address
  is refused), and the connection is *pinned* to one of them: :func:`vet` resolves once, pins the first
  address that accepts a TCP connection (in the resolver's order: ``localhost`` answers ``::1`` first, and a
  server listening on ``127.0.0.1`` only is still reached), and :func:`pin`
  rewrites the request to that address while TLS (SNI and certificate check) and ``Host`` keep the name,
  so a second DNS answer cannot move the connection after the check (DNS rebinding).

:func:`operator_refusal` is the rule for operator endpoints (``--mcp``, ``--intelligence``): their host may be
loopback, but a metadata address, or a private or other non-global one (10/8, 172.16/12, 192.168/16,
fc00::/7, ...), is refused at start-up unless ``egress.allow`` names it; the same rule holds at connect time
for names that resolve there (:mod:`agentd.transport.http_client` checks the connected socket).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final, Literal

import attrs

from agentd import defaults

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
#: IPv6 ranges whose low 32 bits are an IPv4 address the packet is delivered to (the v4-mapped range has its own
#: property on the address). ``::/96`` includes ``::`` and ``::1``: those two are IPv6's own and stay as they are.
_CARRY_LOW_32: Final[tuple[ipaddress.IPv6Network, ...]] = (
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible (deprecated; still routed to the IPv4 address)
    ipaddress.IPv6Network("::ffff:0:0:0/96"),  # IPv4-translated (SIIT)
    ipaddress.IPv6Network("64:ff9b::/96"),  # NAT64, well-known prefix
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # NAT64, local-use prefix (RFC 8215): the IPv4 is in the low bits
)
_SIX_TO_FOUR: Final = ipaddress.IPv6Network("2002::/16")
_FORBIDDEN_CHARACTERS: Final = frozenset("\\ ") | frozenset(chr(c) for c in (*range(0x20), 0x7F))

#: A resolver: (host, port) -> the addresses it resolves to, in preference order.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
#: A probe: (address, port) -> whether a TCP connection to it is accepted (bounded by its caller).
Probe = Callable[[str, int], Awaitable[bool]]


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
    #: Every vetted address, in the resolver's order (``address`` is one of them).
    addresses: tuple[str, ...] = ()


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
    """The IPv4 address an IPv6 address carries and is delivered to (v4-mapped, IPv4-compatible,
    IPv4-translated, NAT64, 6to4); others (``::1`` and ``::`` included) unchanged."""
    if not isinstance(address, ipaddress.IPv6Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if int(address) <= 1:  # ``::`` and ``::1``: IPv6's unspecified and loopback addresses
        return address
    if any(address in network for network in _CARRY_LOW_32):
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
    vetted = tuple(dict.fromkeys(c.split("%", 1)[0] for c in candidates))
    return Allowed(url, parsed.host, vetted[0], port, vetted)


def operator_refusal(url: str, policy: EgressPolicy) -> Refused | None:
    """For an operator endpoint whose host is an address literal: metadata, private and other non-global
    ranges (and multicast) are refused unless ``egress.allow`` names them; loopback is the operator's choice."""
    try:
        host = urllib.parse.urlsplit(url).hostname or ""
    except ValueError:
        return None  # the endpoint checks report it
    literal = _ip_literal(host)
    if literal is None:
        return None
    reason = classify_address(literal, policy, loopback_ok=True)
    return None if reason is None else Refused(origin_of(url), reason)


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


async def tcp_probe(address: str, port: int) -> bool:
    """A TCP connection to ``address`` is accepted within :data:`defaults.EGRESS_PROBE_TIMEOUT` (then closed)."""
    import trio

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with trio.move_on_after(defaults.EGRESS_PROBE_TIMEOUT):
        with trio.socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                await sock.connect((address, port))
            except OSError:
                return False
            return True
    return False


async def vet(
    url: str, policy: EgressPolicy, *, operator_loopback: bool, resolver: Resolver = system_resolver,
    probe: Probe = tcp_probe,
) -> Allowed | Refused:
    """Resolve ``url``'s host once and decide; an :class:`Allowed` carries the address to pin: of several
    vetted addresses, the first that accepts a connection (``probe``), else the first."""
    parsed = parse_url(url)
    if isinstance(parsed, Refused):
        return parsed
    addresses: Sequence[str] = ()
    if _ip_literal(parsed.host) is None:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        addresses = await resolver(parsed.host, port)
    verdict = decide(url, addresses, policy, operator_loopback=operator_loopback)
    if isinstance(verdict, Allowed) and len(verdict.addresses) > 1:
        for address in verdict.addresses:
            if await probe(address, verdict.port):
                return attrs.evolve(verdict, address=address)
    return verdict


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
    "Probe",
    "Refused",
    "Resolver",
    "classify_address",
    "decide",
    "operator_refusal",
    "origin_of",
    "parse_url",
    "pin",
    "system_resolver",
    "tcp_probe",
    "unwrap",
    "vet",
)
