"""MCP events by webhook, as data: ``events/subscribe`` / ``events/unsubscribe`` and the signed POSTs a server
sends to the callback URL.

Why it exists: with webhook delivery (``io.modelcontextprotocol/events``, SEP-3415) the server POSTs each
occurrence to an ``https`` URL the client registered, signed per Standard Webhooks with a secret the *client*
generated (``whsec_`` + base64 of random bytes, :func:`new_secret`). The receiver must verify every POST before
it believes a word of it: ``webhook-signature`` is ``v1,<base64 HMAC-SHA256(secret, id "." timestamp "." body)>``
over the raw body (several space-separated during a rotation; any one may match), ``webhook-timestamp`` within
:data:`TOLERANCE` of now (a captured POST cannot be replayed later), and ``webhook-id`` seen once (the caller keeps
the ids: :func:`verify` only says whether the signature and timestamp hold).

A verified body is an occurrence (:class:`~agentd.mcp.events.Occurrence` and the watermark cursor after it) or a
control envelope (a top-level ``type``): ``verification`` (echo its ``challenge`` in the 2xx answer: the server
delivers only once the endpoint proved it wants to), ``gap`` (events were skipped: a fresh cursor, read as
``truncated``) and ``terminated`` (the subscription is over server-side: subscribe again). :func:`delivery`.

The subscription has a TTL: the server grants ``refreshBefore`` (an ISO 8601 instant, or null for no expiry) and
the client calls ``events/subscribe`` again before it (:func:`refresh_delay`). No I/O here; the caller passes the
clock.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from typing import Any, Final

import attrs

from agentd.mcp.client_session import ResultTypeError
from agentd.mcp.events import Occurrence, PollResult, cursor_of, occurrence

#: Standard Webhooks' freshness window: a POST whose ``webhook-timestamp`` is further from now is refused.
TOLERANCE: Final = 300.0
#: The random bytes of a secret agentd generates (Standard Webhooks allows 24 to 64).
SECRET_BYTES: Final = 32
SECRET_PREFIX: Final = "whsec_"
#: The longest ``webhook-id`` agentd keeps (for duplicate detection).
MAX_ID_CHARS: Final = 256
#: The longest ``challenge`` agentd echoes.
MAX_CHALLENGE_CHARS: Final = 1024
ID_HEADER: Final = "webhook-id"
TIMESTAMP_HEADER: Final = "webhook-timestamp"
SIGNATURE_HEADER: Final = "webhook-signature"
SUBSCRIPTION_HEADER: Final = "x-mcp-subscription-id"


def new_secret() -> str:
    """A fresh signing secret from the CSPRNG: ``whsec_`` + base64 of :data:`SECRET_BYTES` random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def _key(secret: str) -> bytes:
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret must start with whsec_")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret must be whsec_ followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError("a webhook secret must hold 24 to 64 bytes")
    return key


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,<base64>`` signature of one POST (what a server sends; :func:`verify` recomputes it)."""
    mac = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def verify(secret: str, headers: Mapping[str, str], body: bytes, *, now: float,
           tolerance: float = TOLERANCE) -> str | None:
    """Why this POST must be refused (``None``: it was signed with ``secret`` within ``tolerance`` of ``now``).
    ``headers`` are lower-case names. The reason names no secret and no signature."""
    msg_id, stamp, signed = (headers.get(ID_HEADER), headers.get(TIMESTAMP_HEADER),
                             headers.get(SIGNATURE_HEADER))
    if not msg_id or not stamp or not signed:
        return "missing webhook-id, webhook-timestamp or webhook-signature"
    if len(msg_id) > MAX_ID_CHARS:
        return "webhook-id too long"
    try:
        timestamp = int(stamp)
    except ValueError:
        return "webhook-timestamp is not an integer"
    if abs(now - timestamp) > tolerance:
        return f"webhook-timestamp outside the {tolerance:g} s window"
    expected = signature(secret, msg_id, timestamp, body).encode()
    for candidate in signed.split(" "):
        if hmac.compare_digest(candidate.strip().encode(), expected):
            return None
    return "no webhook-signature matches"


def subscribe_params(name: str, arguments: Mapping[str, Any], url: str, secret: str, cursor: str | None,
                     ttl: float | None) -> dict[str, Any]:
    """One ``events/subscribe`` (or its refresh: the same key, the last cursor); ``ttl`` seconds suggested."""
    params: dict[str, Any] = {"name": name, "arguments": dict(arguments),
                              "delivery": {"mode": "webhook", "url": url, "secret": secret}, "cursor": cursor}
    if ttl is not None:
        params["ttlMs"] = int(ttl * 1000)
    return params


def unsubscribe_params(name: str, arguments: Mapping[str, Any], url: str) -> dict[str, Any]:
    return {"name": name, "arguments": dict(arguments), "delivery": {"url": url}}


@attrs.frozen
class Subscribed:
    """An ``events/subscribe`` answer, checked."""

    id: str
    #: When the grant lapses, seconds since the epoch (None: no expiry).
    refresh_before: float | None
    #: The safe-to-persist watermark, and whether delivery starts later than the cursor given (a gap).
    result: PollResult


def _instant(value: Any) -> float | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ResultTypeError("events/subscribe: refreshBefore must be an ISO 8601 string or null")
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ResultTypeError(f"events/subscribe: refreshBefore {value[:64]!r} is not an ISO 8601 instant") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def parse_subscribe(result: Mapping[str, Any]) -> Subscribed:
    sub_id = result.get("id")
    if not isinstance(sub_id, str) or not sub_id:
        raise ResultTypeError("events/subscribe: the answer has no subscription id")
    if "refreshBefore" not in result:
        raise ResultTypeError("events/subscribe: the answer has no refreshBefore")
    cursor = cursor_of(result.get("cursor"), where="events/subscribe")
    return Subscribed(sub_id[:MAX_ID_CHARS], _instant(result.get("refreshBefore")),
                      PollResult((), cursor, truncated=result.get("truncated") is True))


def refresh_delay(refresh_before: float | None, *, now: float, ttl: float, floor: float) -> float:
    """How long until the refresh: half the time left before ``refresh_before`` (at least ``floor``), so a
    slow or failed refresh still has the other half; ``ttl`` when the grant has no expiry (refresh anyway: the
    answer advances the cursor)."""
    if refresh_before is None:
        return ttl
    return max((refresh_before - now) / 2, floor)


@attrs.frozen
class Delivery:
    """A verified body: an occurrence or a gap (``result``), a ``challenge`` to echo, or the subscription's end
    (``terminated``, with the server's reason)."""

    result: PollResult | None = None
    challenge: str | None = None
    terminated: str | None = None


def delivery(body: bytes) -> Delivery:
    """What a verified POST says. Raises :class:`ResultTypeError` for a body agentd cannot read."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        raise ResultTypeError("a webhook body that is not JSON") from None
    if not isinstance(value, Mapping):
        raise ResultTypeError("a webhook body must be an object")
    kind = value.get("type")
    if kind is None:
        found: Occurrence = occurrence(value)
        return Delivery(PollResult((found,), cursor_of(value.get("cursor"), where="a webhook event")))
    if kind == "verification":
        challenge = value.get("challenge")
        if not isinstance(challenge, str) or not challenge or len(challenge) > MAX_CHALLENGE_CHARS:
            raise ResultTypeError("a webhook verification without a usable challenge")
        return Delivery(challenge=challenge)
    if kind == "gap":
        return Delivery(PollResult((), cursor_of(value.get("cursor"), where="a webhook gap"), truncated=True))
    if kind == "terminated":
        error = value.get("error")
        message = error.get("message") if isinstance(error, Mapping) else None
        return Delivery(terminated=str(message)[:200] if message is not None else "no reason given")
    raise ResultTypeError(f"a webhook control envelope of unknown type {str(kind)[:64]!r}")
