"""A small OAuth authorization server for tests: client credentials in, JWT access tokens out.

Real HTTP on 127.0.0.1 (hypercorn). Issuer = its origin; RFC 8414 metadata at
``/.well-known/oauth-authorization-server`` (``jwks_uri``, ``token_endpoint``); the JWKS at ``/jwks``;
``POST /token`` takes ``client_credentials`` with ``client_secret_basic`` and returns an ES256 JWT whose
``aud`` is the request's ``resource`` (RFC 8707) and whose ``scope`` is the requested scope. ``rotate()``
makes a new signing key (new ``kid``) and drops the old one from the JWKS; ``mint()`` signs any claims
(with the current key or another) for the negative cases. It counts JWKS fetches; with ``jwks_hold`` set, it
answers them only once that event is set (a fetch the test keeps in flight).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import jwt
import trio
from cryptography.hazmat.primitives.asymmetric import ec

from tests.peers.asgi import Receive, Send, lifespan, read_body, send_json, serve_loopback


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@attrs.define(eq=False)
class Idp:
    origin: str = ""
    client_id: str = "parent-agent"
    client_secret: str = "parent-secret-value-42"
    expires_in: int = 600
    key: ec.EllipticCurvePrivateKey = attrs.field(factory=_new_key)
    kid: str = "key-1"
    #: Where the metadata says the JWKS is (default: this server's ``/jwks``).
    jwks_uri: str | None = None
    jwks_requests: int = 0
    #: Set: a JWKS request is answered only once this event is set.
    jwks_hold: trio.Event | None = None
    token_requests: list[dict[str, str]] = attrs.field(factory=list)
    _generation: int = 1

    @property
    def issuer(self) -> str:
        return self.origin

    def jwk(self) -> dict[str, Any]:
        data = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key()))
        return {**data, "kid": self.kid, "use": "sig", "alg": "ES256"}

    def rotate(self) -> str:
        self._generation += 1
        self.key, self.kid = _new_key(), f"key-{self._generation}"
        return self.kid

    def mint(self, *, key: ec.EllipticCurvePrivateKey | None = None, kid: str | None = None,
             **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": self.issuer, "iat": now, "exp": now + self.expires_in, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key or self.key, algorithm="ES256", headers={"kid": kid or self.kid, "typ": "at+jwt"})

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        path = scope["path"]
        if path == "/.well-known/oauth-authorization-server":
            await send_json(send, 200, {
                "issuer": self.issuer, "token_endpoint": f"{self.origin}/token", "jwks_uri": self.jwks_uri or f"{self.origin}/jwks",
                "grant_types_supported": ["client_credentials"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"]})  # fmt: skip
        elif path == "/jwks":
            self.jwks_requests += 1
            if self.jwks_hold is not None:
                await self.jwks_hold.wait()
            await send_json(send, 200, {"keys": [self.jwk()]})
        elif path == "/token" and scope["method"] == "POST":
            form = dict(urllib.parse.parse_qsl(body.decode()))
            self.token_requests.append(form)
            auth = headers.get("authorization", "")
            ident, _, secret = base64.b64decode(auth.removeprefix("Basic ") or "Og==").decode().partition(":")
            if (form.get("grant_type") != "client_credentials" or urllib.parse.unquote(ident) != self.client_id
                    or urllib.parse.unquote(secret) != self.client_secret):
                await send_json(send, 401, {"error": "invalid_client"})
                return
            token = self.mint(sub=self.client_id, client_id=self.client_id, aud=form.get("resource"),
                              scope=form.get("scope"))  # fmt: skip
            await send_json(send, 200, {"access_token": token, "token_type": "Bearer", "expires_in": self.expires_in})
        else:
            await send_json(send, 404, {"error": "not_found"})




@asynccontextmanager
async def idp(**knobs: Any) -> AsyncIterator[Idp]:
    app = Idp(**knobs)
    async with serve_loopback(app) as origin:
        app.origin = origin
        yield app
