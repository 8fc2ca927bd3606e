"""The egress guard: the decision as data, DNS pinning over real TLS, and the OAuth discovery wiring."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agentd.connections.auth import ClientCredentialsAuth, ClientCredentialsSettings, ConnectionAuthError
from agentd.telemetry.events import EventLog
from agentd.transport.egress import EgressPolicy, Refused, decide, operator_refusal, pin, vet
from tests.connections.helpers import connection, run
from tests.connections.peer import mcp_peer
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.selfmcp.certs import _write_cert, _write_key, make_ca

NONE = EgressPolicy()
REPO = Path(__file__).resolve().parents[2]


def verdict(url: str, addresses: tuple[str, ...] = (), policy: EgressPolicy = NONE, *, loopback: bool = False):
    return decide(url, addresses, policy, operator_loopback=loopback)


# --- the decision ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/latest/meta-data/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    # every IPv6 form that carries (and is delivered to) an IPv4 address is judged as that address
    "http://[::a9fe:a9fe]/",  # IPv4-compatible ::/96 (deprecated, still routed to 169.254.169.254)
    "http://[::169.254.169.254]/",
    "http://[::ffff:0:a9fe:a9fe]/",  # IPv4-translated
    "http://[64:ff9b:1::a9fe:a9fe]/",  # NAT64, local-use prefix
    "http://[2002:a9fe:a9fe::1]/",  # 6to4
    "http://[fe80::1]/",
    "http://[fd00:ec2::254]/",
])
def test_metadata_addresses_are_refused_even_with_loopback_and_broad_allow(url):
    result = verdict(url, policy=EgressPolicy.from_cidrs(["0.0.0.0/0", "::/0"]), loopback=True)
    assert isinstance(result, Refused) and result.reason == "metadata"


def test_a_metadata_address_is_reachable_only_when_named_explicitly():
    policy = EgressPolicy.from_cidrs(["169.254.169.254/32"])
    assert not isinstance(verdict("http://169.254.169.254/x", policy=policy), Refused)
    assert not isinstance(verdict("http://[::ffff:169.254.169.254]/x", policy=policy), Refused)
    assert verdict("http://169.254.170.2/x", policy=policy).reason == "metadata"


def test_a_name_resolving_to_metadata_is_refused_and_the_message_names_only_the_origin():
    result = verdict("https://metadata.example:8443/path?token=s3cr3t", ("169.254.169.254",))
    assert isinstance(result, Refused) and result.reason == "metadata"
    assert result.origin == "https://metadata.example:8443"
    assert "s3cr3t" not in result.message and "/path" not in result.message


def test_every_resolved_address_must_pass():
    assert verdict("https://mixed.example/", ("93.184.216.34", "169.254.169.254")).reason == "metadata"
    ok = verdict("https://public.example/", ("93.184.216.34", "2606:2800:220:1::1"))
    assert not isinstance(ok, Refused) and ok.address == "93.184.216.34" and ok.host == "public.example"


@pytest.mark.parametrize("address", ["10.1.2.3", "172.16.0.9", "192.168.1.1", "100.64.0.1", "fd12::1"])
def test_private_addresses_need_egress_allow(address):
    host = f"[{address}]" if ":" in address else address
    assert verdict(f"https://{host}/x").reason == "private"
    allowed = verdict(f"https://{host}/x", policy=EgressPolicy.from_cidrs(["10.0.0.0/8", "172.16.0.0/12",
                                                                           "192.168.0.0/16", "100.64.0.0/10",
                                                                           "fc00::/7"]))
    assert not isinstance(allowed, Refused)


def test_loopback_only_when_the_operator_endpoint_is_loopback():
    # "localhost" as a peer-supplied name: its resolution is judged, not its spelling.
    assert verdict("http://localhost:9/x", ("127.0.0.1",)).reason == "loopback"
    assert verdict("http://[::ffff:127.0.0.1]:9/x").reason == "loopback"
    assert verdict("http://0.0.0.0:9/x").reason == "loopback"
    assert not isinstance(verdict("http://localhost:9/x", ("127.0.0.1", "::1"), loopback=True), Refused)
    # A broad allow does not open loopback; an entry inside the loopback range does.
    assert verdict("http://127.0.0.1/", policy=EgressPolicy.from_cidrs(["0.0.0.0/0"])).reason == "loopback"
    assert not isinstance(verdict("http://127.0.0.1/", policy=EgressPolicy.from_cidrs(["127.0.0.1/32"])), Refused)


@pytest.mark.parametrize(("url", "reason"), [
    ("http://a.example/x\r\nHost: evil", "control_characters"),
    ("http://a.example\n/", "control_characters"),
    ("http://a.example/\x00", "control_characters"),
    ("http://a.example\\@169.254.169.254/", "control_characters"),
    ("https://user:pw@a.example/", "userinfo"),
    ("https://user@a.example/", "userinfo"),
    ("file:///etc/passwd", "scheme"),
    ("gopher://a.example/", "scheme"),
    ("http:///nohost", "bad_url"),
])
def test_url_syntax_refusals(url, reason):
    result = verdict(url, ("93.184.216.34",))
    assert isinstance(result, Refused) and result.reason == reason
    assert "\r" not in result.origin and "\n" not in result.origin and "pw" not in result.origin


def test_unresolvable_and_multicast():
    assert verdict("https://nowhere.example/").reason == "unresolvable"
    assert verdict("https://[ff02::1]/").reason == "multicast"


def test_operator_endpoints_refuse_metadata_and_private_literals_but_not_loopback():
    assert operator_refusal("http://169.254.169.254/mcp", NONE).reason == "metadata"
    assert operator_refusal("http://[::ffff:169.254.169.254]/mcp", NONE).reason == "metadata"
    assert operator_refusal("http://[::a9fe:a9fe]/mcp", NONE).reason == "metadata"
    assert operator_refusal("http://169.254.169.254/mcp", EgressPolicy.from_cidrs(["169.254.169.254"])) is None
    for url in ("https://10.0.0.5/mcp", "https://172.16.3.4/mcp", "https://192.168.1.1/mcp", "https://[fd12::1]/mcp",
                "https://[::ffff:10.0.0.5]/mcp", "https://[::a00:5]/mcp", "https://[2002:a00:5::1]/mcp"):
        refused = operator_refusal(url, NONE)
        assert refused is not None and refused.reason == "private", url
        assert operator_refusal(url, EgressPolicy.from_cidrs(["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                              "fc00::/7"])) is None, url
    for url in ("http://127.0.0.1:8/mcp", "http://[::1]:8/mcp", "http://localhost:8/mcp", "https://mcp.example/mcp",
                "https://93.184.216.34/mcp"):
        assert operator_refusal(url, NONE) is None, url


def test_bad_cidr_is_named():
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33'"):
        EgressPolicy.from_cidrs(["10.0.0.0/33"])


# --- pinning: one lookup, the connection goes to the vetted address, TLS keeps the name ------------------


def _server_cert(directory: Path, name: str) -> tuple[Path, Path, Path]:
    ca_path, ca_cert, ca_key = make_ca(directory, "egress-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_cert(cert, directory / "server.crt")
    _write_key(key, directory / "server.key")
    return ca_path, directory / "server.crt", directory / "server.key"


async def _tls_server(certfile: Path, keyfile: Path, seen: list[dict[str, str]], *,
                      task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A one-route HTTPS server on 127.0.0.1 that records the SNI name and the Host header it got."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(certfile), str(keyfile))
    sni: list[str | None] = []
    context.sni_callback = lambda _sock, name, _ctx: sni.append(name)  # type: ignore[assignment,misc,return-value]
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def handle(stream: trio.SocketStream) -> None:
        tls = trio.SSLStream(stream, context, server_side=True)
        data = b""
        with trio.move_on_after(5):
            while b"\r\n\r\n" not in data:
                chunk = await tls.receive_some(4096)
                if not chunk:
                    return
                data += chunk
            lines = data.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            seen.append({"sni": str(sni[-1] if sni else None), "host": headers.get("host", ""),
                         "target": lines[0]})
            await tls.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            await tls.aclose()

    async with trio.open_nursery() as nursery:
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(handle, listeners, handler_nursery=nursery)


async def test_pinned_request_connects_to_the_first_vetted_address_with_tls_for_the_name(tmp_path):
    name = "pinned.egress.test"  # not in any DNS: only the pinned address can reach the server
    ca, certfile, keyfile = _server_cert(tmp_path, name)
    answers = [["127.0.0.1"], ["169.254.169.254"]]  # a rebinding resolver: the second answer is hostile
    lookups: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        lookups.append(host)
        return answers[min(len(lookups) - 1, 1)]

    seen: list[dict[str, str]] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_tls_server, certfile, keyfile, seen)
        url = f"https://{name}:{port}/.well-known/oauth-authorization-server"
        allowed = await vet(url, NONE, operator_loopback=True, resolver=rebinding)
        assert not isinstance(allowed, Refused) and allowed.address == "127.0.0.1"
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as client:
            with trio.fail_after(10):
                response = await client.send(pin(client.build_request("GET", url), allowed))
        assert response.status_code == 200 and response.text == "ok"
        # Without pinning, the client would look the name up itself (and fail: the name is not in DNS).
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as client:
            with pytest.raises(httpx.ConnectError), trio.fail_after(10):
                await client.get(url)
        nursery.cancel_scope.cancel()
    assert lookups == [name]  # resolved once, by the guard; the second (hostile) answer was never asked for
    assert seen == [{"sni": name, "host": f"{name}:{port}",
                     "target": "GET /.well-known/oauth-authorization-server HTTP/1.1"}]


async def test_pinned_tls_still_checks_the_certificate_against_the_name(tmp_path):
    ca, certfile, keyfile = _server_cert(tmp_path, "real.egress.test")

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    async with trio.open_nursery() as nursery:
        seen: list[dict[str, str]] = []
        port = await nursery.start(_tls_server, certfile, keyfile, seen)
        url = f"https://other.egress.test:{port}/"
        allowed = await vet(url, NONE, operator_loopback=True, resolver=resolver)
        assert not isinstance(allowed, Refused)
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as client:
            with pytest.raises(httpx.ConnectError), trio.fail_after(10):
                await client.send(pin(client.build_request("GET", url), allowed))
        nursery.cancel_scope.cancel()
    assert seen == []  # the handshake failed: the certificate is for another name


# --- the OAuth discovery wiring -----------------------------------------------------------------------------

MANIFEST = {
    "connections": [{"ref": "docs", "alias": "docs"}],
    "steps": [{"id": "s", "type": "prompt", "prompt": "p", "tools": ["docs__search"]}],
}
CC_AUTH = {"type": "client_credentials", "clientId": {"env": "CID"}, "clientSecret": {"env": "CSECRET"}}


def _host(gw, peer, **more):
    return {
        "intelligence": {"url": gw.url},
        "connections": {"docs": connection(f"{peer.origin}/mcp", tools=["search"], readTools=["search"],
                                           auth=CC_AUTH)},
        "transcript": {"enabled": False},
        **more,
    }


@pytest.mark.parametrize(("issuer", "origin", "reason"), [
    ("http://169.254.169.254/as", "http://169.254.169.254", "metadata"),
    ("http://[::ffff:169.254.169.254]/as", "http://[::ffff:169.254.169.254]", "metadata"),
    ("http://10.255.0.7/as", "http://10.255.0.7", "private"),
    ("http://user:pw@127.0.0.1:1/as", "http://127.0.0.1:1", "userinfo"),
])
async def test_discovery_refuses_a_hostile_authorization_server(tmp_path, issuer, origin, reason):
    async with mcp_peer(valid_tokens=set(), authorization_server=issuer) as peer, \
            scripted_gateway([tool_call("docs__search", {"q": "x"}), text("ok")]) as gw:
        with trio.fail_after(20):
            outcome = await run(tmp_path, _host(gw, peer), MANIFEST,
                                env={"CID": peer.client_id, "CSECRET": peer.client_secret})
    assert outcome.code == 6, outcome.raw
    assert "egress to" in outcome.doc["error"]["message"] and reason in outcome.doc["error"]["message"]
    refused = outcome.named("egress.refused")
    assert [(e["origin"], e["reason"], e["purpose"]) for e in refused] == [
        (origin, reason, "authorization-server metadata")]
    assert peer.token_requests == [] and "pw" not in refused[0]["origin"]
    assert peer.client_secret not in outcome.raw


def test_egress_allow_is_read_from_the_host_file_and_the_agentd_config_file(tmp_path):
    from agentd.config.host import load_host
    from agentd.config.load import load_config
    from agentd.errors import ConfigError

    host = tmp_path / "host.yaml"
    host.write_text("connections: {}\negress:\n  allow: [10.255.0.0/16, 169.254.169.254]\n")
    policy = load_host(str(host), {}).egress.policy()
    assert not isinstance(verdict("http://10.255.0.7/as", policy=policy), Refused)
    assert not isinstance(verdict("http://169.254.169.254/as", policy=policy), Refused)
    assert verdict("http://10.1.0.7/as", policy=policy).reason == "private"

    agentd_file = tmp_path / "agentd.yaml"
    agentd_file.write_text("egress: {allow: [10.255.0.0/16]}\n")
    config = load_config(["--config", str(agentd_file), "--instruction", "x", "--intelligence", "test"], {})
    assert config.egress.allow == ("10.255.0.0/16",)

    agentd_file.write_text("egress: {allow: [10.255.0.0/33]}\n")
    with pytest.raises(ConfigError, match=r"10.255.0.0/33.*\$\.egress\.allow\[0\]"):
        load_config(["--config", str(agentd_file), "--instruction", "x", "--intelligence", "test"], {})
    agentd_file.write_text("egress: {alow: []}\n")
    with pytest.raises(ConfigError, match="alow"):
        load_config(["--config", str(agentd_file), "--instruction", "x", "--intelligence", "test"], {})


def test_operator_metadata_endpoint_is_exit_2_unless_allowed(tmp_path):
    from agentd.config.load import load_config
    from agentd.errors import ConfigError

    argv = ["--instruction", "x", "--intelligence", "test", "--mcp", "meta=https://169.254.169.254/mcp"]
    with pytest.raises(ConfigError, match=r"metadata address.*egress\.allow"):
        load_config(argv, {})
    agentd_file = tmp_path / "agentd.yaml"
    agentd_file.write_text("egress: {allow: [169.254.169.254/32]}\n")
    assert load_config([*argv, "--config", str(agentd_file)], {}).mcp[0].name == "meta"


async def test_discovery_through_a_pinned_name_on_loopback(tmp_path):
    """One real OAuth discovery: the AS is named by a host only the guard's resolver knows, so every
    discovery request must go to the pinned address; loopback is allowed because the operator's endpoint
    is loopback."""
    lookups: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["127.0.0.1"]

    async with mcp_peer(valid_tokens=set()) as peer:
        port = peer.origin.rsplit(":", 1)[1]
        peer.authorization_server = f"http://as.egress.test:{port}/as"
        events: list[dict[str, object]] = []
        log = EventLog(sink=events.append, run_id="t")
        auth = ClientCredentialsAuth(
            ClientCredentialsSettings(client_id=peer.client_id, client_secret=peer.client_secret),
            "docs", f"{peer.origin}/mcp", log, resolver=resolver,
        )
        body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
        async with httpx.AsyncClient() as client:
            with trio.fail_after(20):
                response = await client.post(f"{peer.origin}/mcp", content=body, auth=auth,
                                             headers={"content-type": "application/json",
                                                      "accept": "application/json, text/event-stream"})
    assert response.status_code != 401
    assert auth.token_requests == 1 and len(peer.token_requests) == 1
    assert "/.well-known/oauth-authorization-server/as" in peer.metadata_requests
    assert lookups == ["as.egress.test"]  # the token endpoint is on the operator's own origin
    assert not [e for e in events if e["event"] == "egress.refused"]


async def test_discovery_refuses_loopback_when_the_operator_endpoint_is_not_loopback():
    """The operator endpoint is a (non-loopback) name; the peer's issuer resolves to loopback: refused,
    before any request to it is made."""

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    events: list[dict[str, object]] = []
    auth = ClientCredentialsAuth(ClientCredentialsSettings(client_id="c", client_secret="s"), "docs",
                                 "https://mcp.example/mcp", EventLog(sink=events.append), resolver=resolver)
    with pytest.raises(ConnectionAuthError, match="loopback") as caught:
        await auth._guarded("http://localhost:8080/as", "authorization-server metadata",
                            lambda u: httpx.Request("GET", u))
    assert caught.value.code == "connection_egress_refused"
    assert [(e["event"], e["origin"], e["reason"]) for e in events] == [
        ("egress.refused", "http://localhost:8080", "loopback")]


def test_ipv6_helpers_unwrap():
    from agentd.transport.egress import unwrap

    for carried, ipv4 in [("::a9fe:a9fe", "169.254.169.254"), ("::ffff:0:a00:1", "10.0.0.1"),
                          ("64:ff9b:1::a00:1", "10.0.0.1"), ("2002:a00:1::5", "10.0.0.1"),
                          ("::7f00:1", "127.0.0.1")]:
        assert unwrap(ipaddress.ip_address(carried)) == ipaddress.ip_address(ipv4), carried
    for own in ("::1", "::", "2001:db8::1"):  # IPv6's own loopback and unspecified addresses stay what they are
        assert unwrap(ipaddress.ip_address(own)) == ipaddress.ip_address(own)

    assert unwrap(ipaddress.ip_address("::ffff:10.0.0.1")) == ipaddress.ip_address("10.0.0.1")


async def test_the_operator_endpoints_own_origin_is_configuration_not_peer_input():
    """A server on a private address (the operator's choice) keeps its well-known discovery; a peer-named
    issuer elsewhere on the private network is refused."""
    lookups: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["10.0.0.6"]

    auth = ClientCredentialsAuth(ClientCredentialsSettings(client_id="c", client_secret="s"), "docs",
                                 "https://10.0.0.5/mcp", EventLog(sink=lambda e: None), resolver=resolver)
    own = await auth._guarded("https://10.0.0.5/.well-known/oauth-protected-resource/mcp", "prm",
                              lambda u: httpx.Request("GET", u))
    assert str(own.url) == "https://10.0.0.5/.well-known/oauth-protected-resource/mcp"
    with pytest.raises(ConnectionAuthError, match="private"):
        await auth._guarded("https://idp.corp/as", "authorization-server metadata", lambda u: httpx.Request("GET", u))
    assert lookups == ["idp.corp"]
    allowed = ClientCredentialsAuth(ClientCredentialsSettings(client_id="c", client_secret="s"), "docs",
                                    "https://10.0.0.5/mcp", EventLog(sink=lambda e: None), resolver=resolver,
                                    egress=EgressPolicy.from_cidrs(["10.0.0.0/24"]))
    pinned = await allowed._guarded("https://idp.corp/as", "x", lambda u: httpx.Request("GET", u))
    assert pinned.url.host == "10.0.0.6" and pinned.headers["host"] == "idp.corp"
    assert pinned.extensions["sni_hostname"] == "idp.corp"


# --- a name with several vetted addresses is pinned to one that answers --------------------------------------


async def test_localhost_is_pinned_to_the_address_that_answers_not_only_the_first():
    """``localhost`` resolves to ``::1`` first on most systems; an issuer listening on 127.0.0.1 only was
    unreachable because the pin took the first address. Now the first vetted address that accepts a TCP
    connection is pinned (still one lookup, still every address vetted)."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    lookups: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["::1", "127.0.0.1"]

    with listener:
        allowed = await vet(f"http://localhost:{port}/as", NONE, operator_loopback=True, resolver=resolver)
    assert not isinstance(allowed, Refused)
    assert (allowed.address, allowed.addresses) == ("127.0.0.1", ("::1", "127.0.0.1"))
    assert lookups == ["localhost"]
    # nothing answers: the first vetted address, as before (the request then fails as a connection error)
    nobody = await vet(f"http://localhost:{port}/as", NONE, operator_loopback=True, resolver=resolver)
    assert not isinstance(nobody, Refused) and nobody.address == "::1"
    # every address is still vetted before any probe: one hostile answer refuses the name
    async def mixed(host: str, port: int) -> list[str]:
        return ["127.0.0.1", "169.254.169.254"]

    probed: list[str] = []

    async def probe(address: str, port: int) -> bool:
        probed.append(address)
        return True

    refused = await vet("http://localhost:9/as", NONE, operator_loopback=True, resolver=mixed, probe=probe)
    assert isinstance(refused, Refused) and refused.reason == "metadata" and probed == []


# --- operator endpoints on private addresses: refused at start-up unless egress.allow names them -------------


def _agentd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentd", "--intelligence", "test", "--instruction", "hi",
                           "--validate-config", *args], capture_output=True, text=True, timeout=60, cwd=REPO)


@pytest.mark.parametrize("url", ["https://10.1.2.3/mcp", "https://172.20.0.1:8443/mcp", "https://192.168.0.10/mcp",
                                 "https://[fd00:1::5]/mcp", "https://[::ffff:10.1.2.3]/mcp"])
def test_an_mcp_server_on_a_private_address_exits_2_naming_the_egress_opt_in(tmp_path, url):
    done = _agentd(tmp_path, "--mcp", f"internal={url}")
    assert done.returncode == 2, done.stderr
    [invalid] = [json.loads(line) for line in done.stderr.splitlines() if '"config.invalid"' in line]
    assert "private" in invalid["error"] and "egress: {allow: [CIDR]}" in invalid["error"]
    assert "egress" in done.stderr and "egress: {allow: [CIDR]}" in done.stderr
    config = tmp_path / "agentd.yaml"
    config.write_text("egress:\n  allow: [10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 'fc00::/7']\n")
    allowed = _agentd(tmp_path, "--config", str(config), "--mcp", f"internal={url}")
    assert allowed.returncode == 0, allowed.stderr


def test_loopback_stays_allowed_and_plain_http_to_a_private_host_stays_refused(tmp_path):
    assert _agentd(tmp_path, "--mcp", "local=http://127.0.0.1:9/mcp").returncode == 0
    assert _agentd(tmp_path, "--mcp", "local=http://localhost:9/mcp").returncode == 0
    config = tmp_path / "agentd.yaml"
    config.write_text("egress:\n  allow: [10.0.0.0/8]\n")
    plain = _agentd(tmp_path, "--config", str(config), "--mcp", "internal=http://10.1.2.3/mcp")
    assert plain.returncode == 2 and "non-loopback" in plain.stderr, plain.stderr


def test_an_a2a_peer_on_a_private_address_is_held_to_the_same_rule(tmp_path):
    done = _agentd(tmp_path, "--a2a-peer", "helper=https://192.168.7.7/a2a")
    assert done.returncode == 2 and "a2a peer 'helper'" in done.stderr and "egress: {allow: [CIDR]}" in done.stderr
    config = tmp_path / "agentd.yaml"
    config.write_text("egress:\n  allow: [192.168.0.0/16]\n")
    assert _agentd(tmp_path, "--config", str(config), "--a2a-peer", "helper=https://192.168.7.7/a2a").returncode == 0


def test_a_host_file_connection_on_a_private_address_is_held_to_the_same_rule(tmp_path):
    from agentd.config.host import load_host
    from agentd.errors import ConfigError
    from tests.connections.helpers import write

    entry = connection("https://10.1.2.3/mcp", tools=["search"], readTools=["search"])
    host = {"version": "1.0", "connections": {"docs": entry}}
    with pytest.raises(ConfigError, match=r"connection 'docs': https://10\.1\.2\.3 is a private .*egress: \{allow"):
        load_host(str(write(tmp_path, "host.yaml", host)), {})
    allowed = load_host(str(write(tmp_path, "host.yaml", {**host, "egress": {"allow": ["10.0.0.0/8"]}})), {})
    assert allowed.connections["docs"].url == "https://10.1.2.3/mcp"
