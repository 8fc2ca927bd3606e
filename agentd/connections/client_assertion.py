"""``private_key_jwt`` client assertions (RFC 7523): the signed JWT a client-credentials token request carries.

Signing is PyJWT's (compact JWS, ES256 with the raw ``r || s`` signature, RS256 with PKCS#1 v1.5); what is
decided here is which algorithm a key may sign with and what the assertion claims. PyJWT is imported only
when an assertion is made, so it stays off the start-up path of every run that does not use
``private_key_jwt``.
"""

from __future__ import annotations

import secrets
from typing import Any, Final

#: How long an assertion is valid, in seconds (RFC 7523 asks for a short ``exp``).
ASSERTION_LIFETIME: Final = 300
JWT_BEARER: Final = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


def sign_jwt(claims: dict[str, Any], pem: str, algorithm: str | None) -> str:
    """A compact JWS (RS256 or ES256) over ``claims``; the algorithm follows the key when not given.

    Raises:
        ValueError: the key cannot be read, or it cannot sign ``algorithm`` (an EC key signs ES256 on
            P-256 only, an RSA key RS256 only). The message never holds key material.
    """
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    key = serialization.load_pem_private_key(pem.encode(), password=None)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        alg = algorithm or "ES256"
        if alg != "ES256" or key.curve.name != "secp256r1":
            raise ValueError("an EC key signs ES256 on P-256 only")
    elif isinstance(key, rsa.RSAPrivateKey):
        alg = algorithm or "RS256"
        if alg != "RS256":
            raise ValueError("an RSA key signs RS256 only")
    else:
        raise ValueError("the private key must be an RSA or P-256 EC key")
    return jwt.encode(claims, key, algorithm=alg, headers={"typ": "JWT"})


def client_assertion(client_id: str, audience: str, now: int, pem: str, algorithm: str | None) -> str:
    """The assertion for one token request: issued by and about ``client_id``, for ``audience`` (the
    authorization server's issuer), valid from ``now`` for :data:`ASSERTION_LIFETIME` seconds, with a
    fresh ``jti`` so a replay can be refused."""
    claims = {"iss": client_id, "sub": client_id, "aud": audience, "iat": now, "exp": now + ASSERTION_LIFETIME,
              "jti": secrets.token_urlsafe(16)}  # fmt: skip
    return sign_jwt(claims, pem, algorithm)
