"""OAuth on the served side: agentd's self-MCP as a resource server, with an identity provider in between.

A real ``agentd --serve-mcp https://...`` (mTLS plus ``--serve-oauth-issuer``) and a small authorization
server (tests/security/idp.py) on loopback. agentd's own MCP client (``open_mcp_pool`` with a
``client_credentials`` connection and a client certificate) discovers the authorization server from the
401's ``resource_metadata``, gets a token for the served URL and calls ``status``. Hand-made tokens check
every refusal: wrong audience, wrong issuer, expired, bad signature (401 ``invalid_token`` with the
challenge), missing scope (403 ``insufficient_scope``). Key rotation runs in process on a mock clock.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives.asymmetric import ec

from agentd.config import McpServerConfig, TlsConfig
from agentd.config.load import load_config
from agentd.connections.auth import ClientCredentialsAuth, ClientCredentialsSettings, parse_challenge
from agentd.errors import ConfigError
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from agentd.transport.resource_server import (
    REFETCH_INTERVAL,
    Accepted,
    OAuthSettings,
    Rejected,
    ResourceServer,
    challenge,
    check_claims,
    metadata_url,
)
from tests.integration.agents import agentd_worker
from tests.peers.tcpqueues import server_has_read
from tests.security.idp import Idp, idp
from tests.selfmcp.certs import Pki, make_pki
from tests.selfmcp.test_composition import worker
from tests.waiting import until

SCOPE = "agent.run"


def _worker_argv(pki: Pki, issuer: str, *extra: str) -> list[str]:
    return ["--serve-mcp", "https://127.0.0.1:0/mcp", "--serve-cert", str(pki.server.cert), "--serve-key",
            str(pki.server.key), "--serve-client-ca", str(pki.ca), "--serve-oauth-issuer", issuer,
            "--serve-oauth-scope", SCOPE, "--intelligence", "test", *extra]


def _mtls_client(pki: Pki) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=pki.client_context(pki.client), trust_env=False)


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "probe", "version": "1"}}}  # fmt: skip
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def _post(client: httpx.AsyncClient, url: str, token: str | None) -> httpx.Response:
    headers = dict(HEADERS)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return await client.post(url, headers=headers, content=json.dumps(INIT))


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
async def test_agentd_client_credentials_to_agentd_over_mtls_and_every_refusal(tmp_path: Path) -> None:
    from agentd.client import open_mcp_pool

    pki = make_pki(tmp_path / "pki")
    worker_log: list[str] = []
    async with idp() as authority:
        async with worker(_worker_argv(pki, authority.issuer, "--serve-a2a"), stderr_lines=worker_log) as bound:
            url = bound  # serve.start advertises the endpoint with its path
            resource = url
            # --- agentd's client: 401 -> discovery -> client_credentials token -> status -------------------
            settings = ClientCredentialsSettings(client_id=authority.client_id,
                                                 client_secret=authority.client_secret, scopes=(SCOPE,))
            log = EventLog(sink=lambda line: None)
            auth = ClientCredentialsAuth(settings, "reviewer", url, log)
            config = McpServerConfig(name="reviewer", url=url, auth=auth,
                                     tls=TlsConfig(ca=str(pki.ca), cert=str(pki.client.cert),
                                                   key=str(pki.client.key)))  # fmt: skip
            with trio.fail_after(60):
                async with open_mcp_pool([config], log=log, secrets=SecretResolver(env={}), run_id="parent") as pool:
                    status = await pool.call_tool("reviewer", "status", {})
            assert status.is_error is False, status
            assert auth.token_requests == 1
            assert authority.token_requests[0]["resource"] == resource
            assert authority.token_requests[0]["scope"] == SCOPE
            assert authority.jwks_requests == 1

            async with _mtls_client(pki) as client:
                # --- the metadata document, at the root and the path-suffixed form, with no token ------------
                origin = bound.removesuffix("/mcp")
                for path in ("/.well-known/oauth-protected-resource",
                             "/.well-known/oauth-protected-resource/mcp"):  # fmt: skip
                    found = await client.get(origin + path)
                    assert found.status_code == 200, path
                    assert found.json() == {"resource": resource, "authorization_servers": [authority.issuer],
                                            "bearer_methods_supported": ["header"], "resource_name": "agentd",
                                            "scopes_supported": [SCOPE]}  # fmt: skip
                assert (await client.get(origin + "/.well-known/oauth-protected-resource/other")).status_code == 404

                # --- no token: 401 with the challenge, no error code --------------------------------------
                missing = await _post(client, url, None)
                assert missing.status_code == 401
                params = parse_challenge(missing.headers["www-authenticate"])
                assert params == {"resource_metadata": f"{origin}/.well-known/oauth-protected-resource/mcp",
                                  "scope": SCOPE}  # fmt: skip

                # --- a good hand-made token passes; every bad one is 401 invalid_token --------------------
                good = authority.mint(aud=resource, scope=SCOPE, sub="someone")
                assert (await _post(client, url, good)).status_code == 200
                other_key = ec.generate_private_key(ec.SECP256R1())
                bad = {
                    "audience": authority.mint(aud="https://elsewhere.example/mcp", scope=SCOPE),
                    "issuer": authority.mint(aud=resource, scope=SCOPE, iss="http://127.0.0.1:1/other"),
                    "expired": authority.mint(aud=resource, scope=SCOPE, exp=1_000_000_000),
                    "signature": authority.mint(aud=resource, scope=SCOPE, key=other_key),
                    "garbage": "not.a.jwt",
                }
                for name, token in bad.items():
                    refused = await _post(client, url, token)
                    assert refused.status_code == 401, name
                    params = parse_challenge(refused.headers["www-authenticate"])
                    assert params["error"] == "invalid_token", name
                    assert params["resource_metadata"] == f"{origin}/.well-known/oauth-protected-resource/mcp"

                # --- the A2A routes on the same listener are behind the same check ------------------------
                card = origin + "/.well-known/agent-card.json"
                assert (await client.get(card)).status_code == 401
                assert (await client.get(card, headers={"Authorization": f"Bearer {bad['audience']}"})
                        ).status_code == 401
                assert (await client.get(card, headers={"Authorization": f"Bearer {good}"})).status_code == 200

                # --- the right token without the scope: 403 insufficient_scope ---------------------------
                narrow = await _post(client, url, authority.mint(aud=resource, scope="something.else"))
                assert narrow.status_code == 403
                params = parse_challenge(narrow.headers["www-authenticate"])
                assert params["error"] == "insufficient_scope" and params["scope"] == SCOPE

            # mTLS still holds: a token without a client certificate does not get through the handshake
            async with httpx.AsyncClient(verify=pki.client_context(None), trust_env=False) as anonymous:
                with pytest.raises(httpx.HTTPError):
                    await _post(anonymous, url, good)
    refused = [json.loads(line) for line in worker_log if '"serve.refused"' in line]
    reasons = {event["reason"] for event in refused}
    assert {"token_missing", "token_audience", "token_issuer", "token_expired", "token_signature",
            "token_malformed", "insufficient_scope"} <= reasons  # fmt: skip
    text = "\n".join(worker_log)
    assert good not in text and authority.client_secret not in text


# --- key rotation, in process, on a mock clock ----------------------------------------------------------------


async def test_jwks_rotation_refetches_on_a_new_kid_at_most_once_per_interval(mock_clock: trio.testing.MockClock
                                                                               ) -> None:
    resource = "https://agentd.example/mcp"
    async with idp() as authority:
        server = ResourceServer(OAuthSettings(authority.issuer, resource, (SCOPE,)))
        first = authority.mint(aud=resource, scope=SCOPE)
        assert isinstance(await server.check(f"Bearer {first}"), Accepted)
        assert authority.jwks_requests == 1
        assert isinstance(await server.check(f"Bearer {first}"), Accepted)
        assert authority.jwks_requests == 1  # cached
        server.clock = lambda: time.time() + 2 * authority.expires_in  # a remembered token still expires
        assert (await server.check(f"Bearer {first}")).reason == "token_expired"  # type: ignore[union-attr]
        server.clock = time.time

        authority.rotate()
        rotated = authority.mint(aud=resource, scope=SCOPE)
        # within the refetch interval of the last fetch: the unknown kid is refused without a fetch
        verdict = await server.check(f"Bearer {rotated}")
        assert isinstance(verdict, Rejected) and verdict.reason == "token_unknown_key"
        assert authority.jwks_requests == 1
        mock_clock.jump(REFETCH_INTERVAL)
        assert isinstance(await server.check(f"Bearer {rotated}"), Accepted)
        assert authority.jwks_requests == 2
        # a flood of made-up kids right after costs no fetch
        for n in range(20):
            forged = authority.mint(aud=resource, scope=SCOPE, kid=f"made-up-{n}")
            assert (await server.check(f"Bearer {forged}")).reason == "token_unknown_key"  # type: ignore[union-attr]
        assert authority.jwks_requests == 2
        # the old key left the JWKS with the rotation
        old = await server.check(f"Bearer {first}")
        assert isinstance(old, Rejected) and old.reason == "token_unknown_key"


async def test_concurrent_unknown_kids_share_one_fetch(mock_clock: trio.testing.MockClock) -> None:
    resource = "https://agentd.example/mcp"
    async with idp() as authority:
        server = ResourceServer(OAuthSettings(authority.issuer, resource, ()))
        token = authority.mint(aud=resource)
        results: list[object] = []

        async def one() -> None:
            results.append(await server.check(f"Bearer {token}"))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(one)
        assert all(isinstance(r, Accepted) for r in results) and len(results) == 10
        assert authority.jwks_requests == 1


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
async def test_a_cold_listeners_concurrent_first_requests_all_wait_for_the_one_key_fetch() -> None:
    """16 clients' first requests reach a listener that has no keys yet: the first starts the one JWKS fetch
    and the other 15 arrive while it is in flight (the authorization server holds its answer until the daemon
    has read every request). Each waits for that fetch and is served; none is refused 503 for want of keys,
    and the keys were fetched once."""
    clients = 16
    async with idp(jwks_hold=trio.Event()) as authority:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-oauth-issuer", authority.issuer,
                "--intelligence", "test"]
        async with agentd_worker(argv) as worker:
            url = urllib.parse.urlsplit(worker.url)
            port = url.port
            assert port is not None and authority.jwks_hold is not None
            streams = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(clients)]
            try:
                for n, stream in enumerate(streams):
                    body = json.dumps(INIT).encode()
                    token = authority.mint(aud=worker.url, sub=f"client-{n}")  # a principal each
                    await stream.send_all(
                        f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {token}\r\n"
                        f"Accept: {HEADERS['Accept']}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
                    if n == 0:
                        await until(lambda: authority.jwks_requests >= 1, timeout=60, what="the key fetch")
                await until(lambda: server_has_read(port, connections=clients), timeout=60,
                            what="every request read by the daemon")
                authority.jwks_hold.set()
                answers = []
                with trio.fail_after(60):
                    for stream in streams:
                        answer = b""
                        while chunk := await stream.receive_some(65536):
                            answer += chunk
                        answers.append(answer)
            finally:
                for stream in streams:
                    await stream.aclose()
    statuses = [a.split(b" ", 2)[1] if a.startswith(b"HTTP/1.1 ") else a[:100] for a in answers]
    assert statuses == [b"200"] * clients, [a[:400] for a in answers if not a.startswith(b"HTTP/1.1 200")]
    assert all(b"mcp-session-id:" in a.lower() for a in answers)
    assert authority.jwks_requests == 1


async def test_requests_during_the_key_fetch_wait_for_it_and_one_whose_fetch_was_cancelled_fetches_again() -> None:
    """Requests that need keys while the one JWKS fetch is in flight wait for it; when the request that made the
    fetch goes away (its fetch cancelled with it), one of the waiters fetches again and all share that."""
    resource = "https://agentd.example/mcp"
    async with idp(jwks_hold=trio.Event()) as authority:
        assert authority.jwks_hold is not None
        server = ResourceServer(OAuthSettings(authority.issuer, resource, ()))
        token = authority.mint(aud=resource)
        results: list[object] = []
        async with trio.open_nursery() as nursery:
            gone = trio.CancelScope()

            async def first() -> None:
                with gone:
                    await server.check(f"Bearer {token}")

            async def later() -> None:
                results.append(await server.check(f"Bearer {token}"))

            nursery.start_soon(first)
            await until(lambda: authority.jwks_requests == 1, timeout=30, what="the first fetch")
            for _ in range(5):
                nursery.start_soon(later)
            await trio.testing.wait_all_tasks_blocked()
            assert results == []  # waiting for the fetch in flight, not refused
            gone.cancel()  # the first request goes away, its fetch with it
            await until(lambda: authority.jwks_requests == 2, timeout=30, what="the fetch made again")
            await trio.testing.wait_all_tasks_blocked()
            assert results == []
            authority.jwks_hold.set()
        assert len(results) == 5 and all(isinstance(r, Accepted) for r in results), results
        assert authority.jwks_requests == 2 and server.fetches == 2


async def test_keys_unavailable_is_503_and_jwks_off_origin_passes_the_egress_guard(
        mock_clock: trio.testing.MockClock) -> None:
    resource = "https://agentd.example/mcp"
    # nothing listens on the issuer: no keys at all -> 503 (not the client's fault)
    server = ResourceServer(OAuthSettings("http://127.0.0.1:9/as", resource, ()))
    authority = Idp(origin="http://127.0.0.1:9/as")
    verdict = await server.check(f"Bearer {authority.mint(aud=resource)}")
    assert isinstance(verdict, Rejected) and (verdict.status, verdict.reason) == (503, "jwks_unavailable")

    # an issuer whose metadata points jwks_uri at the metadata service: refused by the egress guard
    async with idp(jwks_uri="http://169.254.169.254/jwks") as authority:
        lines: list[dict[str, object]] = []
        hostile = ResourceServer(OAuthSettings(authority.issuer, resource, ()), log=EventLog(sink=lines.append))
        verdict = await hostile.check(f"Bearer {authority.mint(aud=resource)}")
        assert isinstance(verdict, Rejected) and verdict.reason == "jwks_unavailable"
        assert authority.jwks_requests == 0
        events = lines
        assert any(e["event"] == "egress.refused" and e["reason"] == "metadata" for e in events), events
        assert any(e["event"] == "serve.jwks" and e["ok"] is False for e in events), events


# --- pure parts ---------------------------------------------------------------------------------------------


def test_check_claims_and_challenge() -> None:
    settings = OAuthSettings("https://as.example", None, ("a", "b"))
    resource = "https://agentd.example/mcp"
    base = {"iss": "https://as.example", "aud": [resource + "/", "x"], "exp": 2000, "scope": "a b c"}
    assert isinstance(check_claims(base, settings, resource, 1000), Accepted)
    assert isinstance(check_claims({**base, "scope": None, "scp": ["a", "b"]}, settings, resource, 1000), Accepted)
    cases = {"token_issuer": {"iss": "https://as.example/"}, "token_audience": {"aud": "https://agentd.example"},
             "token_expired": {"exp": 900}, "token_malformed": {"exp": "soon"},
             "token_not_yet_valid": {"nbf": 1100}}  # fmt: skip
    for reason, change in cases.items():
        verdict = check_claims({**base, **change}, settings, resource, 1000)
        assert isinstance(verdict, Rejected) and (verdict.status, verdict.reason) == (401, reason), reason
    assert check_claims({**base, "exp": 980}, settings, resource, 1000).__class__ is Accepted  # within leeway
    narrow = check_claims({**base, "scope": "a"}, settings, resource, 1000)
    assert isinstance(narrow, Rejected) and (narrow.status, narrow.error) == (403, "insufficient_scope")
    assert metadata_url(resource) == "https://agentd.example/.well-known/oauth-protected-resource/mcp"
    assert metadata_url("https://agentd.example:8443") == \
        "https://agentd.example:8443/.well-known/oauth-protected-resource"
    header = challenge(Rejected(401, "token_missing"), resource, ("a", "b"))
    assert parse_challenge(header) == {
        "resource_metadata": "https://agentd.example/.well-known/oauth-protected-resource/mcp", "scope": "a b"}


@pytest.mark.parametrize(("argv", "message"), [
    (["--serve-oauth-issuer", "http://as.example"], "must be https"),
    (["--serve-oauth-issuer", "https://as.example?x=1"], "without query"),
    (["--serve-oauth-scope", "a"], "needs --serve-oauth-issuer"),
    (["--serve-oauth-issuer", "https://as.example", "--serve-oauth-scope", 'a"b'], "one printable"),
    (["--serve-oauth-issuer", "https://as.example", "--serve-oauth-audience", "ftp://x"], "http(s) URL"),
])
def test_bad_oauth_settings_are_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(["--serve-mcp", "http://127.0.0.1:0", "--intelligence", "test", *argv], env={})


def test_oauth_alone_authenticates_a_non_loopback_listener(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    argv = ["--serve-mcp", "https://0.0.0.0:0", "--serve-cert", str(pki.server.cert), "--serve-key",
            str(pki.server.key), "--intelligence", "test"]
    with pytest.raises(ConfigError, match="--serve-oauth-issuer"):
        load_config(argv, env={})
    with pytest.raises(ConfigError, match="wildcard bind needs --serve-oauth-audience"):
        load_config([*argv, "--serve-oauth-issuer", "https://as.example"], env={})
    config = load_config([*argv, "--serve-oauth-issuer", "https://as.example", "--serve-oauth-audience",
                               "https://agent.example:8443/mcp"], env={})  # fmt: skip
    assert config.serve.oauth_issuer == "https://as.example"


# --- the gate in memory: static bearer beside OAuth, the metadata route's methods ---------------------------


async def test_static_bearer_and_oauth_either_passes_and_metadata_is_get_only(mock_clock: trio.testing.MockClock
                                                                              ) -> None:
    from agentd.selfmcp.surface import AgentInfo, SelfMcpSurface
    from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
    from tests.selfmcp.backend import TaskBackend
    from tests.selfmcp.test_asgi_clock import Exchange

    resource = "http://127.0.0.1:1/mcp"
    async with idp() as authority, trio.open_nursery() as nursery:
        oauth = ResourceServer(OAuthSettings(authority.issuer, None, (SCOPE,)))
        oauth.bind(resource)
        surface = SelfMcpSurface(TaskBackend(nursery), AgentInfo("r", "loop"))
        app = McpAsgiApp(surface, AsgiOptions(bearer="static-bearer-value", oauth=oauth))

        async def ask(method: str, authorization: str | None, path: str = "/mcp") -> Exchange:
            headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
            if authorization is not None:
                headers["authorization"] = authorization
            exchange = Exchange(method, headers, json.dumps(INIT).encode() if method == "POST" else b"")
            exchange.scope["path"] = path
            await app(exchange.scope, exchange.receive, exchange.send)
            return exchange

        assert (await ask("POST", "Bearer static-bearer-value")).status() == 200
        assert (await ask("POST", f"Bearer {authority.mint(aud=resource, scope=SCOPE)}")).status() == 200
        wrong = await ask("POST", "Bearer static-bearer-valuX")
        assert wrong.status() == 401
        challenge_header = dict(wrong.sent[0]["headers"])[b"www-authenticate"].decode()
        assert parse_challenge(challenge_header)["resource_metadata"] == \
            "http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp"
        assert (await ask("GET", None, "/.well-known/oauth-protected-resource/mcp")).status() == 200
        assert (await ask("POST", None, "/.well-known/oauth-protected-resource")).status() == 405
        nursery.cancel_scope.cancel()
