"""The listener's gate: who may reach a mounted app, the same rules for the MCP endpoint, ``/events``, ``/ui/``,
the OAuth metadata and the A2A endpoint.

In order: ``Host`` and ``Origin`` (403, DNS rebinding: parsed strictly, a malformed one is refused, never
guessed at), then the credentials: the static bearer (401 with ``WWW-Authenticate: Bearer``, compared in
constant time) or, with OAuth on (:mod:`agentd.transport.resource_server`), an access token (401 with the
``resource_metadata`` challenge, 403 for missing scope, 503 while the keys cannot be fetched; the static
bearer, when also set, is accepted too). :meth:`Gate.trust` is the synchronous part; :meth:`Gate.authenticate`
the awaited one, and says who passed (agentd.transport.tenancy).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Mapping
from typing import Final

import attrs

from agentd.mcp import jsonrpc
from agentd.mcp.jsonrpc import ErrorResponse
from agentd.mcp.server_session import HttpReply, error_reply
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog, null_log
from agentd.transport.resource_server import Rejected, ResourceServer, bearer_token
from agentd.transport.tenancy import LOCAL, Principal, oauth_principal

LOOPBACK_HOSTS: Final = frozenset({"localhost", "127.0.0.1", "::1"})

#: A Host header: a DNS name, an IPv4 address or a bracketed IPv6 address, then an optional port (RFC 9110
#: 7.2; no userinfo, path or anything else). An Origin is ``http``/``https`` ``://`` and the same (RFC 6454).
_REG_NAME: Final = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_](?:[a-z0-9_-]{0,62}))*\.?")
_AUTHORITY: Final = re.compile(r"(?P<host>\[[0-9a-f:.]+\]|[a-z0-9._-]+)(?::(?P<port>[0-9]{1,5}))?")


@attrs.frozen
class Authority:
    """A strictly parsed Host header or Origin: the host (lower case, brackets and a trailing dot removed) and
    the port, if one was given."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def parse_authority(value: str) -> Authority | None:
    """``host[:port]`` of a Host header, strictly: anything else (userinfo ``a@b``, a path, a backslash,
    whitespace, an empty or out-of-range port) is None, never a guess at which part is the host."""
    match = _AUTHORITY.fullmatch(value.lower())
    if match is None:
        return None
    host, port = match["host"], match["port"]
    if host.startswith("["):
        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            return None
    elif _REG_NAME.fullmatch(host) is None or len(host) > 253:
        return None
    number = None
    if port is not None:
        number = int(port)
        if not 0 < number < 65536:
            return None
    return Authority(host.rstrip("."), number)


def parse_origin(value: str) -> Authority | None:
    """The authority of an ``Origin`` header (``http``/``https`` scheme, nothing after the authority), else None
    (``null`` and anything malformed included)."""
    scheme, sep, rest = value.lower().partition("://")
    if not sep or scheme not in ("http", "https"):
        return None
    return parse_authority(rest)


@attrs.frozen
class Gate:
    """The listener's checks (``AsgiOptions``' part of them), shared by every mounted app."""

    bearer: str | None = attrs.field(default=None, repr=False)
    #: Host names accepted in ``Host``/``Origin``; ``None`` accepts any Host and same-host Origins.
    allowed_hosts: frozenset[str] | None = LOOPBACK_HOSTS
    oauth: ResourceServer | None = attrs.field(default=None, eq=False, repr=False)
    #: A token carrying this scope is an operator (sees every principal's state).
    operator_scope: str | None = None
    log: EventLog = attrs.field(factory=null_log, eq=False, repr=False)

    def trust(self, headers: Mapping[str, str]) -> HttpReply | None:
        """Host/Origin (DNS rebinding) and the static bearer; None: passed (with OAuth on, the credentials are
        :meth:`authenticate`'s: keys may need fetching)."""
        allowed = self.allowed_hosts
        authority = parse_authority(headers.get("host", ""))
        host = authority.host if authority is not None else None
        if host is None or (allowed is not None and host not in allowed):
            return self._refused("host", error_reply(403, jsonrpc.INVALID_REQUEST, "Forbidden: Host not allowed").http)
        origin = headers.get("origin")
        if origin is not None:
            parsed = parse_origin(origin)
            origin_host = parsed.host if parsed is not None else None
            ok = origin_host is not None and (origin_host in allowed if allowed is not None else origin_host == host)
            if not ok:
                return self._refused("origin", error_reply(403, jsonrpc.INVALID_REQUEST,
                                                           "Forbidden: Origin not allowed").http)
        if self.oauth is not None:
            return None
        if self.bearer is not None and not self.bearer_ok(headers):
            return self._refused("bearer", HttpReply(
                401, jsonrpc.dumps(ErrorResponse(None, jsonrpc.INVALID_REQUEST, "Unauthorized")),
                headers=(("www-authenticate", 'Bearer realm="agentd"'),)))
        return None

    def _refused(self, reason: str, reply: HttpReply) -> HttpReply:
        metrics.served_request("refused")
        self.log.info("serve.refused", reason=reason, status=reply.status)
        return reply

    def bearer_ok(self, headers: Mapping[str, str]) -> bool:
        """The static bearer matches (constant time); False when none is configured."""
        expected = self.bearer
        if expected is None:
            return False
        scheme, _, token = headers.get("authorization", "").partition(" ")
        good = hmac.compare_digest(token.strip().encode(), expected.encode())
        return scheme.lower() == "bearer" and good

    async def authorize(self, headers: Mapping[str, str]) -> HttpReply | None:
        """With OAuth on, what :meth:`trust` leaves to be awaited: the static bearer or a valid access token."""
        verdict = await self.authenticate(headers)
        return verdict if isinstance(verdict, HttpReply) else None

    async def authenticate(self, headers: Mapping[str, str]) -> HttpReply | Principal:
        """:meth:`authorize`, and who passed it: an accepted token's principal; without OAuth, or with the
        static bearer beside it, the listener's single principal."""
        oauth = self.oauth
        if oauth is None or self.bearer_ok(headers):
            return LOCAL
        authorization = headers.get("authorization")
        verdict = await oauth.check(authorization)
        if not isinstance(verdict, Rejected):
            return oauth_principal(oauth.settings.issuer, verdict.subject, verdict.client_id, verdict.scopes,
                                   bearer_token(authorization) or "", self.operator_scope)
        metrics.served_request("refused")
        self.log.info("serve.refused", reason=verdict.reason, status=verdict.status)
        if verdict.status == 503:
            return error_reply(503, jsonrpc.INTERNAL_ERROR, "authorization server keys unavailable",
                               headers=(("retry-after", "30"),)).http
        message = "Forbidden: insufficient scope" if verdict.status == 403 else "Unauthorized"
        return HttpReply(verdict.status, jsonrpc.dumps(ErrorResponse(None, jsonrpc.INVALID_REQUEST, message)),
                         "application/json", headers=(("www-authenticate", oauth.challenge(verdict)),))

    async def admit(self, headers: Mapping[str, str]) -> HttpReply | Principal:
        """:meth:`trust`, then (with OAuth on) :meth:`authenticate`: a refusal, or who passed."""
        refusal = self.trust(headers)
        if refusal is not None:
            return refusal
        return await self.authenticate(headers) if self.oauth is not None else LOCAL


__all__ = ["LOOPBACK_HOSTS", "Authority", "Gate", "parse_authority", "parse_origin"]
