"""Auth modes end to end: bearer, oauth through the runtime module's provider, client credentials, redirects."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from agentd.connections.auth import ProviderAuth
from agentd.telemetry.events import EventLog
from tests.connections.helpers import connection, run, write
from tests.connections.peer import mcp_peer
from tests.peers.gateway import scripted_gateway, text, tool_call

MANIFEST = {
    "connections": [{"ref": "docs", "alias": "docs"}],
    "steps": [{"id": "s", "type": "prompt", "prompt": "p", "tools": ["docs__search"]}],
}


def host(gw, peer, **auth_and_more):
    return {
        "intelligence": {"url": gw.url},
        "connections": {
            "docs": connection(f"{peer.origin}/mcp", tools=["search"], readTools=["search"], **auth_and_more)
        },
        "transcript": {"enabled": False},
    }


def script():
    return [tool_call("docs__search", {"q": "x"}), text("ok")]


async def test_bearer_header_seen_by_server_and_never_logged(tmp_path):
    token = "bearer-token-value-9f8e7d"
    async with mcp_peer(bearer=f"Bearer {token}") as peer, scripted_gateway(script()) as gw:
        config = host(gw, peer, auth={"type": "bearer", "token": {"env": "DOCS_TOKEN"}},
                      headers={"X-Workspace": {"env": "DOCS_WORKSPACE"}, "X-Client": "agentd-tests"})
        with trio.fail_after(20):
            outcome = await run(tmp_path, config, MANIFEST, env={"DOCS_TOKEN": token, "DOCS_WORKSPACE": "ws-7"})
    assert outcome.code == 0, outcome.raw
    assert peer.headers_seen and all(h["authorization"] == f"Bearer {token}" for h in peer.headers_seen)
    assert all(h["x-workspace"] == "ws-7" and h["x-client"] == "agentd-tests" for h in peer.headers_seen)
    assert peer.calls == [{"name": "search", "arguments": {"q": "x"}}]
    assert token not in outcome.raw


def provider_module(tmp_path, body: str) -> str:
    log = tmp_path / "provider.jsonl"
    source = f"""
import json
import subprocess
import sys
LOG = {str(log)!r}

def note(*item):
    with open(LOG, "a") as f:
        f.write(json.dumps(item) + "\\n")

{body}
"""
    return str(write(tmp_path, "runtime.py", source))


def provider_calls(tmp_path):
    path = tmp_path / "provider.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


OAUTH_PROVIDER = """
async def get_credential(request):
    note("get", request.credentialProfile, request.forceRefresh)
    if request.credentialProfile == "needs-consent":
        return {"status": "authorization_required"}
    if request.credentialProfile == "broken":
        return {"status": "unavailable"}
    token = "fresh-token-abcdef" if request.forceRefresh else "stale-token-abcdef"
    return {"status": "ready", "headers": {"Authorization": f"Bearer {token}"}}

async def invalidate_credential(request):
    note("invalidate", request.credentialProfile, request["reason"])

connection_credentials = {"get_credential": get_credential, "invalidate_credential": invalidate_credential}
"""


async def test_oauth_provider_401_invalidates_refreshes_and_retries_once(tmp_path):
    module = provider_module(tmp_path, OAUTH_PROVIDER)
    async with mcp_peer(valid_tokens={"fresh-token-abcdef"}) as peer, scripted_gateway(script()) as gw:
        config = host(gw, peer, auth={"type": "oauth", "profile": "customer-documents"})
        with trio.fail_after(20):
            outcome = await run(tmp_path, config, MANIFEST, args=["--runtime-module", module])
    assert outcome.code == 0, outcome.raw
    calls = provider_calls(tmp_path)
    assert calls[:3] == [
        ["get", "customer-documents", False],
        ["invalidate", "customer-documents", "unauthorized"],
        ["get", "customer-documents", True],
    ]
    assert len(calls) == 3  # the fresh credential is cached afterwards
    assert peer.calls == [{"name": "search", "arguments": {"q": "x"}}]
    assert "fresh-token-abcdef" not in outcome.raw


async def test_oauth_second_401_fails_the_connection(tmp_path):
    module = provider_module(tmp_path, OAUTH_PROVIDER)
    async with mcp_peer(valid_tokens=set()) as peer, scripted_gateway(script()) as gw:
        config = host(gw, peer, auth={"type": "oauth", "profile": "customer-documents"})
        with trio.fail_after(20):
            outcome = await run(tmp_path, config, MANIFEST, args=["--runtime-module", module])
    assert outcome.code == 6
    assert "HTTP 401" in outcome.doc["error"]["message"]
    assert [c[0] for c in provider_calls(tmp_path)] == ["get", "invalidate", "get"]  # exactly one retry
    assert len(peer.headers_seen) == 2


@pytest.mark.parametrize(
    ("profile", "code"),
    [
        ("needs-consent", "connection_authorization_required"),
        ("broken", "connection_credentials_unavailable"),
    ],
)
async def test_oauth_authorization_required_and_unavailable(tmp_path, profile, code):
    module = provider_module(tmp_path, OAUTH_PROVIDER)
    async with mcp_peer() as peer, scripted_gateway(script()) as gw:
        config = host(gw, peer, auth={"type": "oauth", "profile": profile})
        with trio.fail_after(20):
            outcome = await run(tmp_path, config, MANIFEST, args=["--runtime-module", module])
    assert outcome.code == 6
    assert outcome.doc["status"] == "mcp_failed" and outcome.doc["error"]["code"] == code
    assert peer.headers_seen == []  # nothing was sent without a credential
    if profile == "needs-consent":
        assert outcome.named("connection.authorization_required")


def _ec_key():
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return key.public_key(), pem


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post", "private_key_jwt"])
async def test_client_credentials_against_local_authorization_server(tmp_path, method):
    public, pem = _ec_key()
    async with (
        mcp_peer(valid_tokens=set(), auth_methods=[method], public_key=public) as peer,
        scripted_gateway(script()) as gw,
    ):
        auth = {"type": "client_credentials", "clientId": {"env": "CID"}, "scopes": ["documents.read"]}
        auth["privateKey" if method == "private_key_jwt" else "clientSecret"] = {
            "env": "CKEY" if method == "private_key_jwt" else "CSECRET"
        }
        config = host(gw, peer, auth=auth)
        env = {"CID": peer.client_id, "CSECRET": peer.client_secret, "CKEY": pem}
        with trio.fail_after(20):
            outcome = await run(tmp_path, config, MANIFEST, env=env)
    assert outcome.code == 0, outcome.raw
    assert peer.metadata_requests[:2] == [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server/as",
    ]
    assert len(peer.token_requests) == 1
    request = peer.token_requests[0]
    assert request["method"] == method and request["form"]["scope"] == "documents.read"
    assert request["form"]["resource"] == f"{peer.origin}/mcp"
    assert peer.calls == [{"name": "search", "arguments": {"q": "x"}}]
    unauthorized = [h for h in peer.headers_seen if "authorization" not in h]
    assert len(unauthorized) == 1  # only the very first request, which triggered discovery
    assert peer.client_secret not in outcome.raw and "tok-0" not in outcome.raw


async def test_client_credentials_refreshes_before_expiry(tmp_path):
    async with mcp_peer(valid_tokens=set(), expires_in=30) as peer, scripted_gateway(script()) as gw:
        auth = {"type": "client_credentials", "clientId": {"env": "CID"}, "clientSecret": {"env": "CSECRET"}}
        config = host(gw, peer, auth=auth)
        with trio.fail_after(20):
            outcome = await run(
                tmp_path, config, MANIFEST, env={"CID": peer.client_id, "CSECRET": peer.client_secret}
            )
    assert outcome.code == 0, outcome.raw
    # A 30 s token is inside the renewal window: each later request gets a new one first, never a 401.
    assert len(peer.token_requests) == len(peer.headers_seen) - 1 >= 3
    assert sum("authorization" not in h for h in peer.headers_seen) == 1


async def test_client_credentials_bad_secret_is_a_connect_failure(tmp_path):
    async with mcp_peer(valid_tokens=set()) as peer, scripted_gateway(script()) as gw:
        auth = {"type": "client_credentials", "clientId": {"env": "CID"}, "clientSecret": {"env": "CSECRET"}}
        with trio.fail_after(20):
            outcome = await run(
                tmp_path,
                host(gw, peer, auth=auth),
                MANIFEST,
                env={"CID": peer.client_id, "CSECRET": "wrong-secret-value"},
            )
    assert outcome.code == 6
    assert "token endpoint answered HTTP 401 (invalid_client)" in outcome.doc["error"]["message"]
    assert "wrong-secret-value" not in outcome.raw


async def test_redirecting_server_is_refused(tmp_path):
    async with mcp_peer(redirect=True) as peer, scripted_gateway(script()) as gw:
        with trio.fail_after(20):
            outcome = await run(tmp_path, host(gw, peer), MANIFEST)
    assert outcome.code == 6
    assert (
        "redirect" in outcome.doc["error"]["message"]
        and "never follows redirects" in outcome.doc["error"]["message"]
    )
    assert gw.requests == []


EXPIRING_PROVIDER = """
import time

async def get_credential(request):
    note("get", request.forceRefresh)
    # expires inside the renewal window: agentd must ask again (force_refresh) before each later request
    return {"status": "ready", "headers": {"Authorization": "Bearer short-lived-token"},
            "expiresAt": (time.time() + 10) * 1000}

async def invalidate_credential(request):
    note("invalidate", request["reason"])  # never: a credential inside the window has not expired yet

connectionCredentials = {"getCredential": get_credential, "invalidateCredential": invalidate_credential}
"""


async def test_oauth_refreshes_before_expiry(tmp_path):
    module = provider_module(tmp_path, EXPIRING_PROVIDER)
    async with mcp_peer(bearer="Bearer short-lived-token") as peer, scripted_gateway(script()) as gw:
        config = host(gw, peer, auth={"type": "oauth", "profile": "p"})
        with trio.fail_after(20):
            outcome = await run(tmp_path, config, MANIFEST, args=["--runtime-module", module])
    assert outcome.code == 0, outcome.raw
    calls = provider_calls(tmp_path)
    assert calls[0] == ["get", False] and all(c == ["get", True] for c in calls[1:])
    assert len(calls) == len(peer.headers_seen) >= 3  # one renewal per request, never a 401


async def test_oauth_credential_past_its_expiry_is_invalidated_as_expired_first():
    """Renewal inside the 60 s window asks again without invalidating; a credential found already past its
    expiry (an idle daemon) is dropped with ``reason: "expired"`` first. In process, on a hand-set clock."""
    now = [1_000_000.0]
    calls: list[tuple[str, bool, str | None]] = []

    class Provider:
        def get_credential(self, request):
            calls.append(("get", request.forceRefresh, None))
            return {"status": "ready", "headers": {"Authorization": f"Bearer token-{len(calls)}"},
                    "expiresAt": now[0] + 100}

        async def invalidate_credential(self, request):
            calls.append(("invalidate", request.forceRefresh, request["reason"]))

    lines: list[dict] = []
    auth = ProviderAuth(Provider(), "docs", "docs", "p", "http://127.0.0.1:9/mcp", EventLog(sink=lines.append),
                        clock=lambda: now[0])
    first = await auth.credential(force=False)
    assert await auth.credential(force=False) is first  # 100 s left: cached
    now[0] += 50  # 50 s left: inside the renewal window, not expired
    await auth.credential(force=False)
    assert calls == [("get", False, None), ("get", True, None)]
    now[0] += 500  # long past the renewed credential's expiry
    third = await auth.credential(force=False)
    assert calls[2:] == [("invalidate", False, "expired"), ("get", True, None)]
    assert third.headers["Authorization"] == "Bearer token-4"
    assert [e.get("status") for e in lines if e["event"] == "connection.auth"].count("expired") == 1


def test_rs256_assertion_verifies_and_challenge_parses():
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    from agentd.connections.auth import parse_challenge
    from agentd.connections.client_assertion import sign_jwt

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    token = sign_jwt({"iss": "c", "sub": "c", "aud": "https://as"}, pem, None)
    head, body, sig = token.split(".")
    import base64

    raw = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
    key.public_key().verify(raw, f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
    assert json.loads(base64.urlsafe_b64decode(head + "==="))["alg"] == "RS256"
    with pytest.raises(ValueError):
        sign_jwt({}, pem, "ES256")
    assert parse_challenge('Bearer error="invalid_token", resource_metadata="https://x/.well-known/a", scope="a b"') == {
        "error": "invalid_token", "resource_metadata": "https://x/.well-known/a", "scope": "a b"}
    assert parse_challenge(None) == {}


def test_es256_client_assertion_verifies_with_the_public_key():
    import jwt

    from agentd.connections.client_assertion import ASSERTION_LIFETIME, client_assertion, sign_jwt

    public, pem = _ec_key()
    token = client_assertion("client-1", "https://as.example", 1_700_000_000, pem, None)
    assert jwt.get_unverified_header(token) == {"alg": "ES256", "typ": "JWT"}
    claims = jwt.decode(token, public, algorithms=["ES256"], audience="https://as.example",
                        options={"verify_exp": False, "verify_iat": False})
    assert claims["iss"] == claims["sub"] == "client-1"
    assert claims["exp"] - claims["iat"] == ASSERTION_LIFETIME and len(claims["jti"]) >= 16
    assert client_assertion("client-1", "https://as.example", 1_700_000_000, pem, None) != token  # fresh jti
    p384 = ec.generate_private_key(ec.SECP384R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    for key, alg in ((pem, "RS256"), (p384, None)):
        with pytest.raises(ValueError, match="EC key signs ES256 on P-256 only"):
            sign_jwt({}, key, alg)


def test_importing_connection_auth_does_not_import_pyjwt():
    code = "import sys, agentd.connections.auth, agentd.connections.cli; print('jwt' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_runtime_http_policy_may_allow_redirects(tmp_path):
    module = provider_module(tmp_path, """
def _record(request):
    note("request", request.method, request.url.path)

def http_policy(connection):
    note("policy", connection.alias, connection["connection"])
    return {"follow_redirects": True, "event_hooks": {"request": [_async(_record)]}}

def _async(fn):
    async def hook(request):
        fn(request)
    return hook
""")
    async with mcp_peer(redirect=True) as peer, scripted_gateway(script()) as gw:
        with trio.fail_after(20):
            outcome = await run(tmp_path, host(gw, peer), MANIFEST, args=["--runtime-module", module])
    assert outcome.code == 0, outcome.raw
    calls = provider_calls(tmp_path)
    assert calls[0] == ["policy", "docs", "docs"]
    assert ["request", "POST", "/moved"] in calls and ["request", "POST", "/mcp"] in calls
    assert peer.calls == [{"name": "search", "arguments": {"q": "x"}}]
