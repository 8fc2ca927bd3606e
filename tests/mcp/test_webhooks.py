"""Webhook delivery as data (agentd.mcp.webhooks): Standard Webhooks signatures as a receiver checks them, the
``events/subscribe`` answer, and what a verified body says."""

from __future__ import annotations

import base64
import json

import pytest

from agentd.mcp import webhooks
from agentd.mcp.client_session import ResultTypeError

# The Standard Webhooks / Svix reference vector.
REF_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
REF_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
REF_TS = 1614265330
REF_BODY = b'{"test": 2432232314}'
REF_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def headers(secret: str = REF_SECRET, msg_id: str = REF_ID, ts: int = REF_TS, body: bytes = REF_BODY,
            signature: str | None = None) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts),
            "webhook-signature": signature or webhooks.signature(secret, msg_id, ts, body)}


def test_the_signature_is_the_standard_webhooks_one() -> None:
    assert webhooks.signature(REF_SECRET, REF_ID, REF_TS, REF_BODY) == REF_SIG
    assert webhooks.verify(REF_SECRET, headers(signature=REF_SIG), REF_BODY, now=REF_TS + 10) is None


def test_a_new_secret_is_whsec_and_32_random_bytes() -> None:
    one, two = webhooks.new_secret(), webhooks.new_secret()
    assert one.startswith("whsec_") and one != two
    assert len(base64.b64decode(one.removeprefix("whsec_"))) == 32
    webhooks.signature(one, "x", 1, b"")  # usable as a key


@pytest.mark.parametrize(("change", "reason"), [
    ({"webhook-signature": "v1," + base64.b64encode(b"x" * 32).decode()}, "no webhook-signature matches"),
    ({"webhook-id": "msg_other"}, "no webhook-signature matches"),
    ({"webhook-signature": ""}, "missing webhook-id"),
    ({"webhook-timestamp": "soon"}, "not an integer"),
    ({"webhook-timestamp": str(REF_TS - 301)}, "outside the 300 s window"),
    ({"webhook-timestamp": str(REF_TS + 301)}, "outside the 300 s window"),
])
def test_a_post_that_does_not_verify_says_why_without_the_secret(change: dict[str, str], reason: str) -> None:
    refused = webhooks.verify(REF_SECRET, {**headers(), **change}, REF_BODY, now=REF_TS)
    assert refused is not None and reason in refused
    assert REF_SECRET.removeprefix("whsec_") not in refused


def test_the_body_is_signed_byte_for_byte_and_any_of_several_signatures_may_match() -> None:
    assert webhooks.verify(REF_SECRET, headers(), REF_BODY + b" ", now=REF_TS) is not None
    other = webhooks.new_secret()
    rotated = f"{webhooks.signature(other, REF_ID, REF_TS, REF_BODY)} {REF_SIG}"
    assert webhooks.verify(REF_SECRET, headers(signature=rotated), REF_BODY, now=REF_TS) is None
    assert webhooks.verify(REF_SECRET, headers(secret=other), REF_BODY, now=REF_TS) is not None


def test_a_secret_that_is_not_whsec_base64_of_24_to_64_bytes_is_refused() -> None:
    for bad in ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_!!", "whsec_" + base64.b64encode(b"short").decode()):
        with pytest.raises(ValueError):
            webhooks.signature(bad, "x", 1, b"")


def test_subscribe_params_and_answer() -> None:
    params = webhooks.subscribe_params("alert.raised", {"sev": "P1"}, "https://h/x", "whsec_s", "c3", 900)
    assert params == {"name": "alert.raised", "arguments": {"sev": "P1"}, "cursor": "c3", "ttlMs": 900_000,
                      "delivery": {"mode": "webhook", "url": "https://h/x", "secret": "whsec_s"}}
    assert webhooks.unsubscribe_params("alert.raised", {}, "https://h/x") == {
        "name": "alert.raised", "arguments": {}, "delivery": {"url": "https://h/x"}}
    granted = webhooks.parse_subscribe({"id": "sub_1", "refreshBefore": "2026-02-19T16:30:00Z", "cursor": "c4",
                                        "truncated": True})
    assert granted.id == "sub_1" and granted.refresh_before == 1771518600.0
    assert granted.result.cursor == "c4" and granted.result.truncated and not granted.result.events
    assert webhooks.parse_subscribe({"id": "s", "refreshBefore": None, "cursor": None}).refresh_before is None
    for bad in ({"refreshBefore": None, "cursor": None}, {"id": "s", "cursor": None},
                {"id": "s", "refreshBefore": "tomorrow", "cursor": None}, {"id": "s", "refreshBefore": None,
                                                                           "cursor": 7}):
        with pytest.raises(ResultTypeError):
            webhooks.parse_subscribe(bad)


def test_refresh_half_way_to_the_grant() -> None:
    assert webhooks.refresh_delay(1000.0, now=900.0, ttl=600, floor=1) == 50.0
    assert webhooks.refresh_delay(1000.0, now=999.5, ttl=600, floor=1) == 1.0
    assert webhooks.refresh_delay(None, now=0.0, ttl=600, floor=1) == 600


def test_what_a_verified_body_says() -> None:
    event = webhooks.delivery(json.dumps({"eventId": "e1", "name": "a", "timestamp": "t", "data": {"k": 1},
                                          "cursor": "c9"}).encode())
    assert event.result is not None and event.result.cursor == "c9"
    assert [o.event_id for o in event.result.events] == ["e1"]
    assert webhooks.delivery(b'{"type":"verification","challenge":"n0nce"}').challenge == "n0nce"
    gap = webhooks.delivery(b'{"type":"gap","cursor":"c20"}').result
    assert gap is not None and gap.truncated and gap.cursor == "c20" and not gap.events
    ended = webhooks.delivery(b'{"type":"terminated","error":{"code":-32012,"message":"revoked"}}')
    assert ended.terminated == "revoked"
    for bad in (b"not json", b"[]", b'{"type":"other"}', b'{"type":"verification"}', b'{"eventId":"e"}'):
        with pytest.raises(ResultTypeError):
            webhooks.delivery(bad)
