"""The self-MCP as an OAuth 2.1 resource server: JWT access tokens from one authorization server.

``--serve-oauth-issuer`` names the authorization server; a request's ``Authorization: Bearer <jwt>`` is
accepted when the token is signed by a key from the issuer's JWKS, its ``iss`` is the issuer, its ``aud``
names this server's resource URL (``--serve-oauth-audience``, default the served URL), it is within its
``exp``/``nbf`` (with :data:`LEEWAY`), and its ``scope``/``scp`` holds every ``--serve-oauth-scope``.

What is decided here is returned as data: :func:`check_claims` is pure, :class:`Rejected` carries the HTTP
status (401, 403 for missing scope, 503 when no keys could be had), the stable ``reason`` for the
``serve.refused`` event and the ``WWW-Authenticate`` challenge (RFC 6750 §3 with RFC 9728's
``resource_metadata``). :class:`ResourceServer` adds the one piece of I/O, the JWKS:

* found through the issuer's RFC 8414 metadata (then OpenID configuration), whose ``issuer`` must match;
* fetched with agentd's HTTP client (no redirects, size-capped, bounded by :data:`FETCH_TIMEOUT`); a URL
  off the issuer's own origin (``jwks_uri`` is the authorization server's word) passes the egress guard
  (:mod:`agentd.transport.egress`) and is pinned to the vetted address;
* cached for :data:`JWKS_TTL`; a token whose ``kid`` is unknown triggers a refetch (key rotation), at most
  once per :data:`REFETCH_INTERVAL`, so a flood of made-up ``kid`` values cannot turn into a flood of
  fetches. A failed refresh keeps the keys already known;
* fetched once at a time: a request that needs a key while a fetch is under way (the many first requests to a
  cold listener, a rotation) waits for that fetch, bounded by :data:`FETCH_TIMEOUT`, and uses its keys instead
  of being refused for want of them.

The protected-resource metadata document (RFC 9728) is built here too; the ASGI app serves it at
``/.well-known/oauth-protected-resource`` and the path-suffixed form. PyJWT and httpx are imported only
when a token is checked or keys are fetched.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from agentd.formats import jsontext as json_text
from agentd.security.loopback import is_loopback_host
from agentd.telemetry.events import EventLog, null_log
from agentd.transport.egress import EgressPolicy, Refused, Resolver, parse_url, pin, system_resolver, vet

if TYPE_CHECKING:
    import httpx

#: Seconds the JWKS is trusted before it is fetched again.
JWKS_TTL: Final = 300.0
#: An unknown ``kid`` refetches the JWKS at most once per this many seconds.
REFETCH_INTERVAL: Final = 30.0
#: Clock skew allowed on ``exp``/``nbf``, seconds.
LEEWAY: Final = 30.0
#: Discovery plus the JWKS fetch, together, must finish within this.
FETCH_TIMEOUT: Final = 10.0
#: Largest metadata or JWKS document read, and most keys kept from one JWKS.
MAX_DOCUMENT: Final = 256 * 1024
MAX_KEYS: Final = 64
#: Longest token examined (a bigger ``Authorization`` header is refused unread).
MAX_TOKEN: Final = 16 * 1024
#: Tokens whose signature verified, remembered (by digest) so a client's next requests skip the signature
#: check (milliseconds each); the claims are checked again every time. Oldest forgotten first.
MAX_VERIFIED: Final = 1024
#: Signature algorithms accepted: asymmetric only (never ``none``, never HMAC with a published key).
ALGORITHMS: Final = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
                               "EdDSA"})  # fmt: skip
WELL_KNOWN: Final = "/.well-known/oauth-protected-resource"


@attrs.frozen
class OAuthSettings:
    """``--serve-oauth-*``. ``audience`` None: the served URL, known once the listener is bound."""

    issuer: str
    audience: str | None = None
    scopes: tuple[str, ...] = ()


@attrs.frozen
class Accepted:
    """A valid token: who it was issued to and what it allows."""

    subject: str | None
    client_id: str | None
    scopes: frozenset[str]


@attrs.frozen
class Rejected:
    """Refuse the request. ``reason`` is stable (the ``serve.refused`` event's), ``error`` the RFC 6750 code
    (empty when no token was sent)."""

    status: int
    reason: str
    error: str = ""
    description: str = ""


def normalize(url: str) -> str:
    """A resource URL compared as the issuer wrote it, minus a trailing slash."""
    return url.rstrip("/")


def metadata_url(resource: str) -> str:
    """RFC 9728 §3.1: the well-known segment goes between the origin and the resource's path."""
    parts = urllib.parse.urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}{parts.path.rstrip('/')}"


def metadata_document(resource: str, settings: OAuthSettings) -> dict[str, Any]:
    document: dict[str, Any] = {
        "resource": resource,
        "authorization_servers": [settings.issuer],
        "bearer_methods_supported": ["header"],
        "resource_name": "agentd",
    }
    if settings.scopes:
        document["scopes_supported"] = list(settings.scopes)
    return document


def challenge(rejected: Rejected, resource: str, scopes: tuple[str, ...]) -> str:
    """The ``WWW-Authenticate`` value for a refusal (values are our own text: no quoting needed)."""
    parts = [f'resource_metadata="{metadata_url(resource)}"']
    if scopes:
        parts.append(f'scope="{" ".join(scopes)}"')
    if rejected.error:
        parts.append(f'error="{rejected.error}"')
    if rejected.description:
        parts.append(f'error_description="{rejected.description}"')
    return "Bearer " + ", ".join(parts)


def token_scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    """RFC 9068's space-separated ``scope``, or the ``scp`` list (string or array) some issuers use."""
    found: set[str] = set()
    for name in ("scope", "scp"):
        value = claims.get(name)
        if isinstance(value, str):
            found.update(value.split())
        elif isinstance(value, list):
            found.update(v for v in value if isinstance(v, str))
    return frozenset(found)


def _invalid(reason: str, description: str) -> Rejected:
    return Rejected(401, reason, "invalid_token", description)


def check_claims(claims: Mapping[str, Any], settings: OAuthSettings, resource: str, now: float) -> Accepted | Rejected:
    """The claims of a token whose signature already verified: issuer, audience, time, scope."""
    if claims.get("iss") != settings.issuer:
        return _invalid("token_issuer", "wrong issuer")
    audience = claims.get("aud")
    audiences = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
    if normalize(resource) not in {normalize(a) for a in audiences if isinstance(a, str)}:
        return _invalid("token_audience", "wrong audience")
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return _invalid("token_malformed", "no exp")
    if now > exp + LEEWAY:
        return _invalid("token_expired", "expired")
    nbf = claims.get("nbf")
    if isinstance(nbf, int | float) and not isinstance(nbf, bool) and now + LEEWAY < nbf:
        return _invalid("token_not_yet_valid", "not yet valid")
    scopes = token_scopes(claims)
    if not set(settings.scopes) <= scopes:
        return Rejected(403, "insufficient_scope", "insufficient_scope", "insufficient scope")
    subject = claims.get("sub")
    client_id = claims.get("client_id", claims.get("azp"))
    return Accepted(subject if isinstance(subject, str) else None,
                    client_id if isinstance(client_id, str) else None, scopes)  # fmt: skip


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@attrs.define(eq=False)
class _Fetch:
    """One JWKS fetch under way, awaited by every request that needs its keys: ``ok`` is its outcome (None
    when it ended without one: cancelled with the request that made it)."""

    done: trio.Event = attrs.field(factory=trio.Event)
    ok: bool | None = None


class _FetchError(Exception):
    """Discovery or the JWKS fetch failed; the message is a stable reason (no URL query, no body)."""


@attrs.define(eq=False)
class ResourceServer:
    """Token checks for one served endpoint, with the issuer's JWKS cached and rotated."""

    settings: OAuthSettings
    egress: EgressPolicy = attrs.field(factory=EgressPolicy)
    log: EventLog = attrs.field(factory=null_log)
    resolver: Resolver = system_resolver
    #: Wall clock for ``exp``/``nbf``; the JWKS cache runs on trio's clock.
    clock: Callable[[], float] = time.time
    #: The resource URL tokens must name (``aud``); set by :meth:`bind` when the audience is the served URL.
    resource: str = ""
    #: JWKS fetches made, successful or not.
    fetches: int = 0
    #: Where the metadata document is served (root and path-suffixed form), kept with ``resource``.
    metadata_paths: frozenset[str] = frozenset({WELL_KNOWN})
    _keys: dict[str, dict[str, Any]] | None = None
    _parsed: dict[tuple[str, str], Any] = attrs.field(factory=dict)
    _verified: dict[bytes, tuple[str, dict[str, Any]]] = attrs.field(factory=dict)
    _fetched_at: float = float("-inf")
    _attempted_at: float = float("-inf")
    #: The JWKS fetch under way (None: none is).
    _fetching: _Fetch | None = None

    def __attrs_post_init__(self) -> None:
        if self.settings.audience is not None:
            self._set_resource(self.settings.audience)

    def bind(self, served_url: str) -> None:
        """The listener's bound URL (``--serve-mcp`` with the real port): the audience unless configured."""
        if self.settings.audience is None:
            self._set_resource(normalize(served_url))

    def _set_resource(self, resource: str) -> None:
        self.resource = resource
        path = urllib.parse.urlsplit(resource).path.rstrip("/")
        self.metadata_paths = frozenset({WELL_KNOWN, WELL_KNOWN + path})

    def metadata(self) -> bytes:
        return json.dumps(metadata_document(self.resource, self.settings)).encode()

    def challenge(self, rejected: Rejected) -> str:
        return challenge(rejected, self.resource, self.settings.scopes)

    # -- checking a token -----------------------------------------------------------------------------------

    async def check(self, authorization: str | None) -> Accepted | Rejected:
        token = bearer_token(authorization)
        if token is None:
            return Rejected(401, "token_missing")
        if len(token) > MAX_TOKEN:
            return _invalid("token_malformed", "token too large")
        digest = hashlib.sha256(token.encode()).digest()
        seen = self._verified.get(digest)
        if seen is not None and seen[0] in (self._keys or {}) and trio.current_time() - self._fetched_at < JWKS_TTL:
            return check_claims(seen[1], self.settings, self.resource, self.clock())
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            return _invalid("token_malformed", "not a JWT")
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ALGORITHMS:
            return _invalid("token_malformed", "unsupported algorithm")
        if kid is not None and not isinstance(kid, str):
            return _invalid("token_malformed", "bad kid")
        now = trio.current_time()
        if now - self._fetched_at >= JWKS_TTL and now - self._attempted_at >= REFETCH_INTERVAL:
            await self.refresh()
        jwk = self._key(kid)
        due = trio.current_time() - self._attempted_at >= REFETCH_INTERVAL
        if jwk is None and (due or self._fetching is not None):
            # No keys yet, or an unknown kid (the issuer may have rotated its keys): fetch, or share the fetch
            # under way (the first requests to a cold listener arrive while the first one fetches).
            await self.refresh()
            jwk = self._key(kid)
        if jwk is None:
            if self._keys is None:
                return Rejected(503, "jwks_unavailable", description="authorization server keys unavailable")
            return _invalid("token_unknown_key", "unknown key")
        key = self._public_key(kid or "", jwk, alg)
        if key is None:
            return _invalid("token_signature", "key does not fit the algorithm")
        try:
            claims = jwt.decode(token, key, algorithms=[alg], options={
                "verify_signature": True, "verify_exp": False, "verify_nbf": False, "verify_iat": False,
                "verify_aud": False, "verify_iss": False, "verify_sub": False, "verify_jti": False})  # fmt: skip
        except jwt.InvalidSignatureError:
            return _invalid("token_signature", "bad signature")
        except jwt.InvalidTokenError:
            return _invalid("token_malformed", "unreadable token")
        if len(self._verified) >= MAX_VERIFIED:
            del self._verified[next(iter(self._verified))]
        self._verified[digest] = (kid or "", claims)
        return check_claims(claims, self.settings, self.resource, self.clock())

    def _key(self, kid: str | None) -> dict[str, Any] | None:
        keys = self._keys or {}
        if kid is not None:
            return keys.get(kid)
        return next(iter(keys.values())) if len(keys) == 1 else None  # no kid: only an unambiguous key

    def _public_key(self, kid: str, jwk: dict[str, Any], alg: str) -> Any:
        cached = self._parsed.get((kid, alg))
        if cached is not None:
            return cached
        import jwt

        if jwk.get("alg", alg) != alg or jwk.get("kty") == "oct":
            return None
        try:
            key = jwt.PyJWK(jwk, algorithm=alg).key
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            return None
        if len(self._parsed) >= 4 * MAX_KEYS:
            self._parsed.clear()
        self._parsed[(kid, alg)] = key
        return key

    # -- the JWKS ---------------------------------------------------------------------------------------------

    async def refresh(self) -> bool:
        """Fetch the JWKS now; while a fetch is under way, wait for that one instead (bounded: it is, by
        :data:`FETCH_TIMEOUT`) and share its outcome. True when the keys were fetched."""
        while True:
            running = self._fetching
            if running is None:
                return await self._refetch()
            with trio.move_on_after(FETCH_TIMEOUT):
                await running.done.wait()
            if running.ok is not None or not running.done.is_set():
                return bool(running.ok)
            # that fetch ended without an outcome (cancelled with the request that made it): fetch again

    async def _refetch(self) -> bool:
        fetch = self._fetching = _Fetch()
        try:
            self._attempted_at = trio.current_time()
            self.fetches += 1
            try:
                with trio.fail_after(FETCH_TIMEOUT):
                    keys = await self._fetch()
            except (_FetchError, trio.TooSlowError) as exc:
                reason = str(exc) if isinstance(exc, _FetchError) else "timeout"
                self.log.warn("serve.jwks", ok=False, reason=reason[:300], keys=len(self._keys or {}))
                fetch.ok = False
                return False
            old = self._keys or {}

            def same(kid: str) -> bool:  # a kid whose key changed forgets what it verified
                return kid in keys and keys[kid] == old.get(kid)

            self._parsed = {k: v for k, v in self._parsed.items() if same(k[0])}
            self._verified = {k: v for k, v in self._verified.items() if same(v[0])}
            self._keys = keys
            self._fetched_at = trio.current_time()
            self.log.info("serve.jwks", ok=True, keys=len(keys))
            fetch.ok = True
            return True
        finally:
            self._fetching = None
            fetch.done.set()

    async def _fetch(self) -> dict[str, dict[str, Any]]:
        import httpx

        from agentd.transport.http_client import new_client

        try:
            async with new_client() as client:
                jwks_uri = await self._discover(client)
                document = await self._get_json(client, jwks_uri, "jwks")
        except httpx.HTTPError as exc:
            raise _FetchError(f"http: {exc.__class__.__name__}") from None
        raw = document.get("keys")
        if not isinstance(raw, list):
            raise _FetchError("the JWKS has no keys list")
        keys: dict[str, dict[str, Any]] = {}
        for entry in raw[:MAX_KEYS]:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig" or entry.get("kty") == "oct":
                continue
            kid = entry.get("kid")
            keys[kid if isinstance(kid, str) else ""] = entry
        return keys

    async def _discover(self, client: httpx.AsyncClient) -> str:
        issuer = self.settings.issuer
        parts = urllib.parse.urlsplit(issuer)
        origin, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
        candidates = [f"{origin}/.well-known/oauth-authorization-server{path}",
                      f"{issuer.rstrip('/')}/.well-known/openid-configuration"]  # fmt: skip
        for candidate in candidates:
            try:
                metadata = await self._get_json(client, candidate, "authorization-server metadata")
            except _FetchError:
                continue
            if metadata.get("issuer") != issuer:
                raise _FetchError("the authorization-server metadata names another issuer")
            jwks_uri = metadata.get("jwks_uri")
            if not isinstance(jwks_uri, str):
                raise _FetchError("the authorization-server metadata has no jwks_uri")
            return jwks_uri
        raise _FetchError("no authorization-server metadata found")

    async def _get_json(self, client: httpx.AsyncClient, url: str, purpose: str) -> dict[str, Any]:
        import httpx

        request = await self._guarded(url, purpose, lambda u: httpx.Request("GET", u,
                                                                             headers={"Accept": "application/json"}))
        response = await client.send(request, stream=True)
        try:
            if response.status_code != 200:
                raise _FetchError(f"{purpose}: HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_DOCUMENT:
                    raise _FetchError(f"{purpose}: larger than {MAX_DOCUMENT} bytes")
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await response.aclose()
        try:
            data = json_text.loads(bytes(body), "replace")
        except ValueError:
            raise _FetchError(f"{purpose}: not JSON") from None
        if not isinstance(data, dict):
            raise _FetchError(f"{purpose}: not a JSON object")
        return data

    async def _guarded(self, url: str, purpose: str, build: Callable[[str], httpx.Request]) -> httpx.Request:
        """The issuer's own origin is configuration; any other URL is the authorization server's word and
        passes the egress guard (pinned to the vetted address)."""
        issuer = urllib.parse.urlsplit(self.settings.issuer)
        parsed = parse_url(url)
        if isinstance(parsed, Refused):
            raise _FetchError(f"{purpose}: {parsed.message}")
        default = {"http": 80, "https": 443}
        if (parsed.scheme, parsed.host, parsed.port or default[parsed.scheme]) == (
            issuer.scheme, (issuer.hostname or "").lower(), issuer.port or default.get(issuer.scheme, 0)
        ):
            return build(url)
        verdict = await vet(url, self.egress, operator_loopback=is_loopback_host(issuer.hostname or ""),
                            resolver=self.resolver)  # fmt: skip
        if isinstance(verdict, Refused):
            self.log.warn("egress.refused", origin=verdict.origin, reason=verdict.reason, purpose=purpose)
            raise _FetchError(f"{purpose}: {verdict.message}")
        return pin(build(url), verdict)


__all__ = (
    "ALGORITHMS",
    "JWKS_TTL",
    "REFETCH_INTERVAL",
    "Accepted",
    "OAuthSettings",
    "Rejected",
    "ResourceServer",
    "bearer_token",
    "challenge",
    "check_claims",
    "metadata_document",
    "metadata_url",
    "token_scopes",
)
