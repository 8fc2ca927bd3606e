"""Per-request authentication for host connections, as ``httpx.Auth`` flows on the MCP client's transport.

The MCP client consults ``McpServerConfig.auth`` on every request (``HttpTransport.auth``): the flow adds
credentials, and on a 401 it invalidates what it had, gets a fresh credential and retries the request
once. A second 401 reaches the client as an ordinary HTTP error. Flows run in the requesting task, so
they are trio code like everything else.

* ``bearer`` needs no flow: the token is an ``Authorization: Bearer {{secret:NAME}}`` header template,
  resolved (and registered with the redactor) by the pool at connect time.
* :class:`ProviderAuth` (``oauth``): the runtime module's credential provider returns ready headers
  (with an optional expiry), ``authorization_required`` or ``unavailable``. A ready credential is reused
  until shortly before it expires, then asked for again with ``force_refresh=True``; one already past its
  expiry is first dropped with ``invalidate_credential(reason="expired")``.
* :class:`ClientCredentialsAuth` (``client_credentials``): discovery (RFC 9728 protected-resource metadata
  from the ``WWW-Authenticate`` challenge or the well-known URL, then RFC 8414 / OIDC authorization-server
  metadata), the token request (``client_secret_basic``, ``client_secret_post`` or ``private_key_jwt``,
  whose assertion :mod:`agentd.connections.client_assertion` signs), a cached token re-acquired before it
  expires. Discovery and token requests are yielded from the flow,
  so they go through the same client: no redirects, the connection's TLS settings. Every URL a peer
  supplied (the challenge's ``resource_metadata``, the issuer, the token endpoint) passes the egress guard
  (:mod:`agentd.transport.egress`) first and is pinned to the vetted address; a refusal is an
  ``egress.refused`` event and a ``connection_egress_refused`` error.

Secrets never reach a message: errors carry the connection name, URLs without query, HTTP statuses and
the OAuth ``error`` code only. Every credential value is registered with the log's redactor.
"""

from __future__ import annotations

import base64
import datetime as dt
import inspect
import time
import urllib.parse
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Final

import attrs
import httpx

from agentd.connections.client_assertion import JWT_BEARER, client_assertion
from agentd.errors import McpConnectError
from agentd.formats import jsontext as json_text
from agentd.security.loopback import is_loopback_host
from agentd.telemetry.events import EventLog
from agentd.transport.egress import EgressPolicy, Refused, Resolver, parse_url, pin, system_resolver, vet
from agentd.transport.http_client import display_url

#: A credential is renewed when it expires within this many seconds.
REFRESH_SKEW: Final = 60.0


class ConnectionAuthError(McpConnectError):
    """Credentials for a connection could not be obtained. ``code`` is stable (``connection_...``)."""

    def __init__(self, message: str, *, server: str | None, code: str) -> None:
        super().__init__(message, server=server)
        self.code = code


class ConnectionAuthorizationRequired(ConnectionAuthError):
    """The credential provider says the user must authorize this connection first."""

    def __init__(self, message: str, *, server: str | None) -> None:
        super().__init__(message, server=server, code="connection_authorization_required")


# --- the credential provider interface (mirrors ConnectionCredentialProvider) ---------------------------


@attrs.frozen
class CredentialRequest:
    """What a provider is asked. Readable as attributes in either spelling, or as a mapping
    (``request.credentialProfile``, ``request.credential_profile``, ``request["forceRefresh"]``)."""

    connection: str
    alias: str
    credential_profile: str
    url: str
    force_refresh: bool = False
    run_id: str = ""
    reason: str | None = None  # for invalidate_credential: "expired" | "unauthorized"

    @property
    def credentialProfile(self) -> str:
        return self.credential_profile

    @property
    def forceRefresh(self) -> bool:
        return self.force_refresh

    @property
    def runId(self) -> str:
        return self.run_id

    def to_dict(self) -> dict[str, Any]:
        return {
            "connection": self.connection,
            "alias": self.alias,
            "credentialProfile": self.credential_profile,
            "url": self.url,
            "forceRefresh": self.force_refresh,
            "runId": self.run_id,
            **({"reason": self.reason} if self.reason else {}),
        }

    def __getitem__(self, key: str) -> Any:
        data = self.to_dict()
        if key in data:
            return data[key]
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except AttributeError:
            return default


@attrs.frozen
class Credential:
    """A ``ready`` result: headers to send and when they stop being valid (epoch seconds, or None)."""

    headers: Mapping[str, str]
    expires_at: float | None = None


async def call_maybe_async(function: Callable[..., Any], *args: Any) -> Any:
    """Call a runtime-module function that may be sync or async (both are accepted everywhere)."""
    result = function(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def member(obj: Any, *names: str) -> Any:
    """``obj.name`` or ``obj["name"]`` for the first spelling present (snake_case or camelCase)."""
    for name in names:
        if isinstance(obj, Mapping):
            if name in obj:
                return obj[name]
        elif hasattr(obj, name):
            return getattr(obj, name)
    return None


def _epoch(value: Any) -> float | None:
    """An expiry as epoch seconds: a datetime, an ISO 8601 string, or a number (milliseconds if huge, as
    JavaScript's ``Date.now()``)."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) / 1000 if value > 1e11 else float(value)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return _epoch(parsed)
    return None


@attrs.define(eq=False)
class ProviderAuth(httpx.Auth):
    """``auth: {type: oauth, profile}``: headers from the runtime module's credential provider."""

    provider: Any
    connection: str
    alias: str
    profile: str
    url: str
    log: EventLog
    run_id: str = ""
    clock: Callable[[], float] = time.time
    _credential: Credential | None = None

    def _request(self, *, force: bool, reason: str | None = None) -> CredentialRequest:
        return CredentialRequest(self.connection, self.alias, self.profile, display_url(self.url), force, self.run_id,
                                 reason)  # fmt: skip

    async def credential(self, *, force: bool) -> Credential:
        cached = self._credential
        if not force and cached is not None:
            left = None if cached.expires_at is None else cached.expires_at - self.clock()
            if left is None or left > REFRESH_SKEW:
                return cached
            if left <= 0:
                # Past its expiry (a daemon idle longer than the credential lives): the provider drops it first,
                # as the host-configuration design asks, then is asked for a fresh one.
                self.log.info("connection.auth", connection=self.alias, type="oauth", status="expired", refresh=True)
                await self.invalidate("expired")
            force = True  # expired or about to: renew before it is refused
        get = member(self.provider, "get_credential", "getCredential")
        if not callable(get):
            raise ConnectionAuthError(
                f"connection {self.alias!r}: the runtime module's connection_credentials has no get_credential",
                server=self.alias, code="connection_credentials_unavailable",
            )  # fmt: skip
        result = await call_maybe_async(get, self._request(force=force))
        status = member(result, "status")
        self.log.info(
            "connection.auth", connection=self.alias, type="oauth", status=str(status), refresh=force
        )
        if status == "ready":
            headers = member(result, "headers") or {}
            if not isinstance(headers, Mapping):
                raise ConnectionAuthError(f"connection {self.alias!r}: ready credential without headers",
                                          server=self.alias, code="connection_credentials_unavailable")  # fmt: skip
            clean = {str(k): str(v) for k, v in headers.items()}
            for value in clean.values():
                self.log.redactor.add(value)
                if " " in value:
                    self.log.redactor.add(value.split(" ", 1)[1])
            self._credential = Credential(clean, _epoch(member(result, "expires_at", "expiresAt")))
            return self._credential
        self._credential = None
        if status == "authorization_required":
            self.log.warn("connection.authorization_required", connection=self.alias, profile=self.profile)
            raise ConnectionAuthorizationRequired(
                f"connection {self.alias!r} (profile {self.profile!r}) requires user authorization "
                "(connection_authorization_required)",
                server=self.alias,
            )
        raise ConnectionAuthError(
            f"connection {self.alias!r}: credentials are unavailable (provider status {status!r})",
            server=self.alias, code="connection_credentials_unavailable",
        )  # fmt: skip

    async def invalidate(self, reason: str) -> None:
        self._credential = None
        drop = member(self.provider, "invalidate_credential", "invalidateCredential")
        if callable(drop):
            await call_maybe_async(drop, self._request(force=False, reason=reason))

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        credential = await self.credential(force=False)
        request.headers.update(credential.headers)
        response = yield request
        if response.status_code != 401:
            return
        self.log.warn(
            "connection.auth", connection=self.alias, type="oauth", status="unauthorized", refresh=True
        )
        await self.invalidate("unauthorized")
        credential = await self.credential(force=True)
        request.headers.update(credential.headers)
        yield request


# --- client credentials --------------------------------------------------------------------------------


@attrs.frozen
class ClientCredentialsSettings:
    """Resolved client-credentials settings (values, not references: built at connect time)."""

    client_id: str
    client_secret: str | None = None
    private_key_pem: str | None = None
    scopes: tuple[str, ...] = ()
    method: str | None = None  # client_secret_basic | client_secret_post | private_key_jwt | None: choose
    signing_algorithm: str | None = None


@attrs.frozen
class _Token:
    access_token: str
    expires_at: float | None


def parse_challenge(header: str | None) -> dict[str, str]:
    """The parameters of a ``WWW-Authenticate: Bearer k="v", ...`` challenge (lower-case keys)."""
    if not header:
        return {}
    text = header.strip()
    if text.lower().startswith("bearer"):
        text = text[6:]
    params: dict[str, str] = {}
    i = 0
    while i < len(text):
        while i < len(text) and text[i] in " ,":
            i += 1
        eq = text.find("=", i)
        if eq < 0:
            break
        key = text[i:eq].strip().lower()
        i = eq + 1
        if i < len(text) and text[i] == '"':
            end = i + 1
            value = []
            while end < len(text) and text[end] != '"':
                if text[end] == "\\" and end + 1 < len(text):
                    end += 1
                value.append(text[end])
                end += 1
            params[key] = "".join(value)
            i = end + 1
        else:
            end = text.find(",", i)
            end = len(text) if end < 0 else end
            params[key] = text[i:end].strip()
            i = end
    return params


def well_known(url: str, suffix: str, *, path_first: bool = True) -> list[str]:
    """RFC 8615 locations for ``url``: ``/.well-known/<suffix><path>`` first, then the origin's."""
    parts = urllib.parse.urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    found = [f"{origin}/.well-known/{suffix}{path}"] if path and path_first else []
    return [*found, f"{origin}/.well-known/{suffix}"]


@attrs.define(eq=False)
class ClientCredentialsAuth(httpx.Auth):
    """``auth: {type: client_credentials}``: discover, get a token, cache it, renew it, retry once on 401."""

    settings: ClientCredentialsSettings
    alias: str
    url: str
    log: EventLog
    clock: Callable[[], float] = time.time
    _token: _Token | None = None
    _metadata: dict[str, Any] | None = None
    _resource: str | None = None
    _challenge_scope: str | None = None
    #: Token requests made (tests and the transcript of what happened).
    token_requests: int = 0
    #: The egress guard for peer-supplied URLs (``egress.allow``) and its DNS seam.
    egress: EgressPolicy = attrs.field(factory=EgressPolicy)
    resolver: Resolver = system_resolver

    async def _guarded(self, url: str, purpose: str, build: Callable[[str], httpx.Request]) -> httpx.Request:
        """The request ``build(url)`` pinned to the vetted address of ``url``, or a
        ``connection_egress_refused`` error. The raw text is vetted before httpx parses it (httpx would
        percent-encode some of what the guard refuses). URLs on the operator endpoint's own origin are
        configuration, not peer input, and go as they are."""
        operator = httpx.URL(self.url)
        parsed = parse_url(url)
        if not isinstance(parsed, Refused) and (parsed.scheme, parsed.host, parsed.port) == (
            operator.scheme, operator.host, operator.port
        ):
            return build(url)
        verdict = await vet(url, self.egress, operator_loopback=is_loopback_host(operator.host),
                            resolver=self.resolver)  # fmt: skip
        if isinstance(verdict, Refused):
            self.log.warn("egress.refused", connection=self.alias, origin=verdict.origin, reason=verdict.reason,
                          purpose=purpose)  # fmt: skip
            raise self._fail(f"{purpose}: {verdict.message}", code="connection_egress_refused")
        return pin(build(url), verdict)

    def _fail(self, what: str, code: str = "connection_credentials_unavailable") -> ConnectionAuthError:
        return ConnectionAuthError(f"connection {self.alias!r}: client_credentials: {what}", server=self.alias,
                                   code=code)  # fmt: skip

    def _valid(self) -> _Token | None:
        token = self._token
        if token is None or (
            token.expires_at is not None and token.expires_at - self.clock() <= REFRESH_SKEW
        ):
            return None
        return token

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        token = self._valid()
        if token is None and self._metadata is not None:
            # Known authorization server and no usable token (first use after discovery, or about to expire).
            endpoint = self._metadata["token_endpoint"]
            token_request = await self._guarded(endpoint, "token endpoint", self._token_request)
            response = yield token_request
            token = await self._take_token(response)
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token.access_token}"
        response = yield request
        if response.status_code != 401:
            return
        self._token = None
        challenge = parse_challenge(response.headers.get("www-authenticate"))
        if challenge.get("scope"):
            self._challenge_scope = challenge["scope"]
        if self._metadata is None:
            prm: dict[str, Any] | None = None
            candidates = [challenge["resource_metadata"]] if challenge.get("resource_metadata") else []
            candidates += [u for u in well_known(self.url, "oauth-protected-resource") if u not in candidates]
            for candidate in candidates:
                found = yield await self._guarded(candidate, "protected-resource metadata", _get_json)
                prm = await _json_or_none(found)
                if prm is not None:
                    break
            issuer = self._issuer_from(prm)
            metadata: dict[str, Any] | None = None
            for candidate in [*well_known(issuer, "oauth-authorization-server"),
                              *well_known(issuer, "openid-configuration")]:  # fmt: skip
                found = yield await self._guarded(candidate, "authorization-server metadata", _get_json)
                metadata = await _json_or_none(found)
                if metadata is not None and isinstance(metadata.get("token_endpoint"), str):
                    break
                metadata = None
            if metadata is None:
                raise self._fail(f"no authorization server metadata found for {display_url(issuer)}")
            self._metadata = metadata
            self.log.info("connection.auth", connection=self.alias, type="client_credentials", status="discovered",
                          issuer=display_url(issuer), token_endpoint=display_url(metadata["token_endpoint"]))  # fmt: skip
        endpoint = self._metadata["token_endpoint"]
        response = yield await self._guarded(endpoint, "token endpoint", self._token_request)
        token = await self._take_token(response)
        request.headers["Authorization"] = f"Bearer {token.access_token}"
        yield request

    def _issuer_from(self, prm: dict[str, Any] | None) -> str:
        if prm is None:
            parts = urllib.parse.urlsplit(self.url)
            return f"{parts.scheme}://{parts.netloc}"  # no metadata: the resource's origin (2025-03-26)
        resource = prm.get("resource")
        if isinstance(resource, str):
            self._resource = resource
        servers = prm.get("authorization_servers")
        if not isinstance(servers, list) or not servers or not isinstance(servers[0], str):
            raise self._fail("the protected-resource metadata names no authorization server")
        issuer: str = servers[0]
        return issuer

    def _method(self) -> str:
        if self.settings.method:
            return self.settings.method
        supported = (self._metadata or {}).get("token_endpoint_auth_methods_supported") or [
            "client_secret_basic"
        ]
        if self.settings.private_key_pem and (
            "private_key_jwt" in supported or not self.settings.client_secret
        ):
            return "private_key_jwt"
        if "client_secret_basic" in supported:
            return "client_secret_basic"
        if "client_secret_post" in supported:
            return "client_secret_post"
        return "private_key_jwt" if self.settings.private_key_pem else "client_secret_basic"

    def _token_request(self, endpoint: str) -> httpx.Request:
        assert self._metadata is not None
        form: dict[str, str] = {"grant_type": "client_credentials"}
        scope = " ".join(self.settings.scopes) or self._challenge_scope
        if scope:
            form["scope"] = scope
        if self._resource:
            form["resource"] = self._resource
        headers = {"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"}
        method = self._method()
        client_id = self.settings.client_id
        if method == "client_secret_basic":
            secret = self.settings.client_secret or ""
            pair = f"{urllib.parse.quote(client_id, safe='')}:{urllib.parse.quote(secret, safe='')}"
            basic = base64.b64encode(pair.encode()).decode()
            self.log.redactor.add(basic)
            headers["Authorization"] = f"Basic {basic}"
        elif method == "client_secret_post":
            form["client_id"] = client_id
            form["client_secret"] = self.settings.client_secret or ""
        else:
            if not self.settings.private_key_pem:
                raise self._fail("private_key_jwt needs privateKey")
            issuer = str(self._metadata.get("issuer") or endpoint)
            try:
                assertion = client_assertion(client_id, issuer, int(self.clock()), self.settings.private_key_pem,
                                             self.settings.signing_algorithm)  # fmt: skip
            except ValueError as exc:
                raise self._fail(f"cannot sign the client assertion ({exc})") from None
            self.log.redactor.add(assertion)
            form["client_id"] = client_id
            form["client_assertion_type"] = JWT_BEARER
            form["client_assertion"] = assertion
        self.token_requests += 1
        return httpx.Request("POST", endpoint, headers=headers, content=urllib.parse.urlencode(form).encode())

    async def _take_token(self, response: httpx.Response) -> _Token:
        body = await _json_or_none(response, any_status=True)
        if response.status_code != 200 or body is None:
            code = body.get("error") if isinstance(body, dict) else None
            detail = f" ({code})" if isinstance(code, str) and code.isascii() and len(code) < 64 else ""
            self.log.warn("connection.auth", connection=self.alias, type="client_credentials", status="refused",
                          http_status=response.status_code)  # fmt: skip
            raise self._fail(f"the token endpoint answered HTTP {response.status_code}{detail}")
        access = body.get("access_token")
        if not isinstance(access, str) or not access:
            raise self._fail("the token response holds no access_token")
        self.log.redactor.add(access)
        expires_in = body.get("expires_in")
        expires_at = self.clock() + float(expires_in) if isinstance(expires_in, int | float) else None
        self._token = _Token(access, expires_at)
        self.log.info("connection.auth", connection=self.alias, type="client_credentials", status="ready",
                      expires_in=expires_in if isinstance(expires_in, int | float) else None)  # fmt: skip
        return self._token


def _get_json(url: str) -> httpx.Request:
    return httpx.Request("GET", url, headers={"Accept": "application/json"})


async def _json_or_none(response: httpx.Response, *, any_status: bool = False) -> dict[str, Any] | None:
    """A JSON object body (a 200 unless ``any_status``), else None. Redirects are never followed."""
    try:
        await response.aread()
    except httpx.HTTPError:
        return None
    if not any_status and response.status_code != 200:
        return None
    if len(response.content) > 1024 * 1024:
        return None
    try:
        data = json_text.loads(response.content, "replace")
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


__all__ = (
    "ClientCredentialsAuth",
    "ClientCredentialsSettings",
    "ConnectionAuthError",
    "ConnectionAuthorizationRequired",
    "Credential",
    "CredentialRequest",
    "ProviderAuth",
    "call_maybe_async",
    "member",
    "parse_challenge",
)
