"""Every bad input, many at once, refused with its exact shape while a well-behaved client is served.

Each test runs its bad traffic in parallel tasks (``hammer``) under ``kept_serving``, whose background
client calls ``tools/call status`` throughout and fails the test on any error or a stall.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agentd.selfmcp.surface import AgentInfo, SelfMcpSurface
from agentd.transport.asgi import DISCARD_MAX, DISCARD_TIME
from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
from tests.selfmcp.backend import TaskBackend
from tests.selfmcp.certs import Pki, make_pki
from tests.selfmcp.concurrent import hammer, kept_serving
from tests.selfmcp.harness import ACCEPT, LegacyPeer, decode_reply, modern_headers, rpc, serving
from tests.waiting import until

TOKEN = "s3cret-token-for-tests"
AUTH = {"authorization": f"Bearer {TOKEN}"}
INIT = rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                          "clientInfo": {"name": "x", "version": "0"}}, 0)
REQUEST = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def _error(r: httpx.Response, status: int, code: int, message: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == code, body
    if message is not None:
        assert body["error"]["message"] == message, body
    return dict(body)


async def _still_serving(url: str, **client: Any) -> None:
    """A brand-new client can still open a session and call a tool."""
    headers = client.pop("headers", None)
    async with httpx.AsyncClient(timeout=5, **client) as fresh:
        peer = LegacyPeer(fresh, url, headers=headers)
        with trio.fail_after(5):
            await peer.initialize()
            reply = await peer.call("tools/call", {"name": "status", "arguments": {}})
        assert reply["result"]["structuredContent"]["run_id"] == "run-test"


# -- bearer --------------------------------------------------------------------------------------------------


async def test_wrong_missing_and_tampered_bearers_are_401_in_parallel() -> None:
    bad_auth = [None, "Bearer wrong", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN,
                "Bearer", f"bearer{TOKEN}", f"Bearer {TOKEN.upper()}"]
    async with serving(bearer=TOKEN) as s, kept_serving(s.url, headers=AUTH) as probe, \
            httpx.AsyncClient(timeout=5, limits=httpx.Limits(max_connections=32)) as bad:
        turn = 0

        async def attack() -> None:
            nonlocal turn
            auth = bad_auth[turn % len(bad_auth)]
            turn += 1
            headers = dict(ACCEPT) | ({"authorization": auth} if auth is not None else {})
            r = await bad.post(s.url, headers=headers, json=INIT)
            body = _error(r, 401, -32600, "Unauthorized")
            assert body["id"] is None
            assert r.headers["www-authenticate"] == 'Bearer realm="agentd"'
            assert "mcp-session-id" not in r.headers
            assert TOKEN not in r.text and TOKEN not in str(r.headers)

        made = await hammer(probe, attack, parallel=16, rounds=10)
        assert made >= 16
        assert len(s.app.core.sessions) == 1  # only the probe's: no refused request made a session


async def test_session_ids_do_not_stand_in_for_the_bearer_and_cannot_be_hijacked() -> None:
    """"Replayed bearer", decided (docs/self-mcp.md): the static bearer *is* the principal, so the same token
    from another connection is served (that is what a shared secret means); what must hold is that a
    session id never replaces it, reveals nothing without it, and dies with its session."""
    async with serving(bearer=TOKEN) as s, kept_serving(s.url, headers=AUTH) as probe, \
            httpx.AsyncClient(timeout=5) as bad:
        victim = probe.session
        fabricated = "0" * 32

        async def attack() -> None:
            # the victim's session id with no / a wrong bearer: 401, the same as for a made-up id (no oracle)
            for sid in (victim, fabricated):
                for auth in ({}, {"authorization": "Bearer wrong"}):
                    base = {**ACCEPT, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25", **auth}
                    call = rpc("tools/call", {"name": "subagent.spawn", "arguments": {"instruction": "x"}}, 7)
                    r = await bad.post(s.url, headers=base, json=call)
                    assert _error(r, 401, -32600, "Unauthorized") == {
                        "jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Unauthorized"}}
                    # ending or streaming the victim's session without the token is refused too
                    r = await bad.delete(s.url, headers=base)
                    assert r.status_code == 401
                    r = await bad.get(s.url, headers={**base, "accept": "text/event-stream"})
                    assert r.status_code == 401
            # the token with a session id that was never issued: 404, not a new or someone else's session
            r = await bad.post(s.url, headers={**ACCEPT, **AUTH, "mcp-session-id": fabricated}, json=rpc("ping"))
            _error(r, 404, -32600, "Session not found")

        await hammer(probe, attack, parallel=6, rounds=8)
        assert victim in s.app.core.sessions  # the DELETEs above did not end it: the probe is still served
        assert s.backend.spawned == []  # the unauthenticated spawns never reached the backend

        # the same token from another connection is accepted (a static shared secret), and a session that
        # was ended cannot be replayed: its id is 404 for good, even with the token
        async with httpx.AsyncClient(timeout=5) as other:
            peer = LegacyPeer(other, s.url, headers=AUTH)
            await peer.initialize()
            ended = peer.session
            assert (await other.delete(s.url, headers=peer.headers())).status_code == 200
            r = await other.post(s.url, headers=peer.headers(), json=rpc("ping"))
            _error(r, 404, -32600, "Session not found")
            assert ended not in s.app.core.sessions


# -- Host / Origin -------------------------------------------------------------------------------------------


async def test_bad_origin_and_host_are_403_in_parallel() -> None:
    async with serving() as s, kept_serving(s.url) as probe, \
            httpx.AsyncClient(timeout=5, limits=httpx.Limits(max_connections=32)) as bad:
        port = s.serving.port
        cases = [
            ({"origin": "https://evil.example.com"}, "Forbidden: Origin not allowed"),
            ({"origin": f"http://evil.example.com:{port}"}, "Forbidden: Origin not allowed"),
            ({"origin": "null"}, "Forbidden: Origin not allowed"),
            ({"host": "evil.example.com", "origin": "http://evil.example.com"}, "Forbidden: Host not allowed"),
            ({"host": f"rebind.example.com:{port}"}, "Forbidden: Host not allowed"),
        ]
        turn = 0

        async def attack() -> None:
            nonlocal turn
            extra, message = cases[turn % len(cases)]
            turn += 1
            headers = {**ACCEPT, **extra, "mcp-session-id": probe.session}
            r = await bad.post(s.url, headers=headers, json=INIT)
            _error(r, 403, -32600, message)
            assert "mcp-session-id" not in r.headers

        await hammer(probe, attack, parallel=16, rounds=10)
        r = await bad.post(s.url, headers={**ACCEPT, "origin": f"http://localhost:{port}"}, json=INIT)
        assert r.status_code == 200  # a loopback Origin is fine
        assert len(s.app.core.sessions) == 2
        await _still_serving(s.url)


# -- body size, malformed JSON, wrong params ----------------------------------------------------------------


async def test_oversized_bodies_are_413_in_parallel() -> None:
    limit = 64 * 1024
    async with serving(max_body=limit) as s, kept_serving(s.url) as probe, httpx.AsyncClient(timeout=10) as bad:
        big = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * (4 * limit) + b'"}}'
        turn = 0

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(8):
                yield b"x" * (limit // 4)

        async def attack() -> None:
            nonlocal turn
            headers = {**ACCEPT, "mcp-session-id": probe.session}
            turn += 1
            if turn % 2:
                r = await bad.post(s.url, headers=headers, content=big)  # refused on Content-Length
            else:
                r = await bad.post(s.url, headers=headers, content=chunks())  # refused while streaming
                assert r.request.headers.get("transfer-encoding") == "chunked"
            _error(r, 413, -32600, f"request body exceeds {limit} bytes")

        await hammer(probe, attack, parallel=6, rounds=8)
        # one at a time, too: before the server read the rest of a refused body, closing the connection with
        # it unread reset it, and the peer lost the 413 about one time in five
        for _ in range(20):
            r = await bad.post(s.url, headers={**ACCEPT, "mcp-session-id": probe.session}, content=big)
            _error(r, 413, -32600, f"request body exceeds {limit} bytes")


async def test_malformed_json_and_wrong_params_in_parallel() -> None:
    async with serving() as s, kept_serving(s.url) as probe, \
            httpx.AsyncClient(timeout=5, limits=httpx.Limits(max_connections=32)) as bad:
        sid = probe.session
        legacy = {**ACCEPT, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
        parse_errors = [b'{"jsonrpc":"2.0",', b"not json", b"\xff\xfe{}", b'{"jsonrpc":"2.0","id":1,"method":"ping"']
        wrong_params: list[tuple[dict[str, Any], int]] = [
            (rpc("resources/read", {"uri": 42}, 5), -32602),
            (rpc("tools/call", {"name": "subagent.spawn", "arguments": {}}, 6), -32602),
            (rpc("tools/call", {"name": "subagent.spawn", "arguments": {"instruction": 7}}, 7), -32602),
            (rpc("tools/call", {"name": "no.such.tool", "arguments": {}}, 8), -32601),
            (rpc("resources/read", {"uri": "agent://subagent/nope"}, 9), -32002),
        ]
        turn = 0

        async def attack() -> None:
            nonlocal turn
            turn += 1
            body = parse_errors[turn % len(parse_errors)]
            r = await bad.post(s.url, headers=legacy, content=body)
            assert _error(r, 400, -32700)["id"] is None
            message, code = wrong_params[turn % len(wrong_params)]
            r = await bad.post(s.url, headers=legacy, json=message)
            if message["params"].get("name") == "subagent.spawn":
                # a spawn is answered as SSE (keepalives while a run works), refusals included
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                answer = decode_reply(r)
                assert answer["error"]["code"] == code
                assert answer["error"]["data"]["errors"]  # the schema violations are named
            else:
                answer = _error(r, 200, code)
            assert answer["id"] == message["id"]
            # the modern wire: _meta without protocolVersion/clientCapabilities is 400 -32602
            r = await bad.post(s.url, headers=modern_headers("tools/call", "status"),
                               json=rpc("tools/call", {"name": "status", "arguments": {}, "_meta": {}}, 10))
            assert _error(r, 400, -32602)["id"] == 10

        await hammer(probe, attack, parallel=8, rounds=10)
        assert s.backend.spawned == []  # no malformed or invalid call started anything
        await _still_serving(s.url)


# -- floods --------------------------------------------------------------------------------------------------


async def test_session_flood_is_capped_at_64_while_the_probe_is_served() -> None:
    async with serving() as s, kept_serving(s.url) as probe, \
            httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=100)) as flood:
        waves = 0

        async def wave() -> None:
            nonlocal waves
            waves += 1
            answers: list[httpx.Response] = []

            async def one() -> None:
                answers.append(await flood.post(s.url, headers=ACCEPT, json=INIT))

            async with trio.open_nursery() as nursery:
                for _ in range(100):
                    nursery.start_soon(one)
            made = [r for r in answers if r.status_code == 200]
            refused = [r for r in answers if r.status_code != 200]
            assert len(made) == 63  # 64 with the probe's
            assert len({r.headers["mcp-session-id"] for r in made}) == 63
            for r in refused:
                body = _error(r, 503, -32603, "session limit reached (64); end a session with DELETE")
                assert body["id"] == 0
                assert r.headers["retry-after"] == "5"
            assert probe.session in s.app.core.sessions
            async def end(sid: str) -> None:
                assert (await flood.delete(s.url, headers={"mcp-session-id": sid})).status_code == 200

            async with trio.open_nursery() as nursery:
                for r in made:
                    nursery.start_soon(end, r.headers["mcp-session-id"])
            assert list(s.app.core.sessions) == [probe.session]

        await hammer(probe, wave, parallel=1, rounds=5, timeout=25)
        assert waves >= 1
        await _still_serving(s.url)


async def test_slowloris_connections_are_cut_off_while_the_probe_is_served() -> None:
    header_timeout = 0.5
    async with serving(header_timeout=header_timeout) as s, kept_serving(s.url) as probe:
        port = s.serving.port
        cut_after: list[float] = []

        async def slow_client() -> None:
            sock = await trio.open_tcp_stream("127.0.0.1", port)
            opened = trio.current_time()
            got = b""
            async with sock:
                await sock.send_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                with trio.fail_after(header_timeout + 4):
                    while True:
                        try:
                            await sock.send_all(b"X-Slow: 1\r\n")
                            with trio.move_on_after(0.1):
                                data = await sock.receive_some(4096)
                                got += data
                                if data == b"":
                                    break
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            break
            cut_after.append(trio.current_time() - opened)
            # cut off without ever being answered as a request (at most hypercorn's own 4xx)
            assert got == b"" or got.startswith(b"HTTP/1.1 4"), got[:80]

        async def attack() -> None:
            async with trio.open_nursery() as nursery:
                for _ in range(32):
                    nursery.start_soon(slow_client)

        await hammer(probe, attack, parallel=1, rounds=5, timeout=15)
        assert len(cut_after) >= 32
        assert min(cut_after) >= header_timeout * 0.8  # the timeout, not an instant refusal
        assert max(cut_after) <= header_timeout + 3
        await _still_serving(s.url)



async def test_slow_bodies_are_408_while_the_probe_is_served() -> None:
    """Headers complete, the body dribbles: the body timeout answers 408 (not the header timeout's cut)."""
    body_timeout = 0.5
    async with serving(body_timeout=body_timeout) as s, kept_serving(s.url) as probe:
        port = s.serving.port
        answered_after: list[float] = []

        async def slow_body() -> None:
            sock = await trio.open_tcp_stream("127.0.0.1", port)
            async with sock:
                await sock.send_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                    b"Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{")
                opened = trio.current_time()
                got = b""
                with trio.fail_after(body_timeout + 4):
                    while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
                        try:
                            await sock.send_all(b" ")
                        except trio.BrokenResourceError:
                            pass
                        with trio.move_on_after(0.1):
                            data = await sock.receive_some(4096)
                            if not data:
                                break
                            got += data
                answered_after.append(trio.current_time() - opened)
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), got[:200]
            assert b'"code":-32600' in body.replace(b" ", b"") and b"request body too slow" in body

        async def attack() -> None:
            async with trio.open_nursery() as nursery:
                for _ in range(16):
                    nursery.start_soon(slow_body)

        await hammer(probe, attack, parallel=1, rounds=5, timeout=15)
        assert min(answered_after) >= body_timeout * 0.8
        assert max(answered_after) <= body_timeout + 3
        await _still_serving(s.url)

# -- TLS -----------------------------------------------------------------------------------------------------


async def _tls_refused(port: int, context: ssl.SSLContext) -> str:
    """Open TLS, send a request; return where it broke. It must break before any HTTP byte comes back."""
    stage = "handshake"
    with trio.fail_after(10):
        try:
            stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=context)
            async with stream:
                await stream.do_handshake()
                stage = "first read"  # TLS 1.3: the server judges the client certificate after its Finished
                await stream.send_all(REQUEST)
                data = await stream.receive_some(4096)
                assert data == b"", data[:80]
                return "eof"
        except trio.BrokenResourceError as exc:
            assert isinstance(exc.__cause__, ssl.SSLError), repr(exc.__cause__)
            return stage


async def test_tls_refusals_in_parallel(tmp_path: Path) -> None:
    pki: Pki = make_pki(tmp_path)
    async with serving(pki=pki, mtls=True) as s, \
            kept_serving(s.url, verify=pki.client_context(pki.client)) as probe:
        port = s.serving.port
        stages: dict[str, set[str]] = {}
        turn = 0

        def tls12(context: ssl.SSLContext) -> ssl.SSLContext:
            context.maximum_version = ssl.TLSVersion.TLSv1_2
            return context

        cases = {
            "no cert (TLS 1.3)": lambda: pki.client_context(None),
            "other CA (TLS 1.3)": lambda: pki.client_context(pki.rogue_client),
            "no cert (TLS 1.2)": lambda: tls12(pki.client_context(None)),
            "other CA (TLS 1.2)": lambda: tls12(pki.client_context(pki.rogue_client)),
        }
        names = list(cases)

        async def attack() -> None:
            nonlocal turn
            turn += 1
            name = names[turn % (len(names) + 1)] if turn % (len(names) + 1) < len(names) else "plain HTTP"
            if name == "plain HTTP":
                sock = await trio.open_tcp_stream("127.0.0.1", port)
                async with sock:
                    with trio.fail_after(10):
                        await sock.send_all(REQUEST)
                        try:
                            data = await sock.receive_some(4096)
                        except trio.BrokenResourceError:
                            data = b""
                assert data == b"", data[:80]  # dropped: no HTTP answer on the TLS port
                stages.setdefault(name, set()).add("eof")
            else:
                stages.setdefault(name, set()).add(await _tls_refused(port, cases[name]()))

        await hammer(probe, attack, parallel=10, rounds=8)
        # the refusal's shape: a TLS 1.2 handshake fails; a TLS 1.3 one fails on the first read (the server
        # checks the certificate after the client's Finished); never an HTTP status
        assert stages["no cert (TLS 1.2)"] == {"handshake"}
        assert stages["other CA (TLS 1.2)"] == {"handshake"}
        assert stages["no cert (TLS 1.3)"] <= {"first read", "eof"}
        assert stages["other CA (TLS 1.3)"] <= {"first read", "eof"}
        assert stages["plain HTTP"] == {"eof"}
        await _still_serving(s.url, verify=pki.client_context(pki.client))




async def test_stalled_tls_handshakes_are_cut_off_while_the_probe_is_served(tmp_path: Path) -> None:
    """TLS slowloris: silent connections and half a ClientHello are closed at the handshake timeout."""
    pki = make_pki(tmp_path)
    timeout = 0.5
    async with serving(pki=pki, mtls=True, header_timeout=timeout) as s, \
            kept_serving(s.url, verify=pki.client_context(pki.client)) as probe:
        port = s.serving.port
        cut_after: list[float] = []
        hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40  # a ClientHello, truncated

        async def stalled(first: bytes) -> None:
            sock = await trio.open_tcp_stream("127.0.0.1", port)
            opened = trio.current_time()
            async with sock:
                if first:
                    await sock.send_all(first)
                with trio.fail_after(timeout + 4):
                    try:
                        data = await sock.receive_some(4096)
                    except trio.BrokenResourceError:
                        data = b""
            assert data == b"", data[:80]
            cut_after.append(trio.current_time() - opened)

        async def attack() -> None:
            async with trio.open_nursery() as nursery:
                for i in range(24):
                    nursery.start_soon(stalled, hello if i % 2 else b"")

        await hammer(probe, attack, parallel=1, rounds=5, timeout=15)
        assert min(cut_after) >= timeout * 0.8
        assert max(cut_after) <= timeout + 3
        await _still_serving(s.url, verify=pki.client_context(pki.client))


# -- a real agentd process -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
async def test_a_real_daemon_refuses_a_mixed_barrage_and_keeps_serving(tmp_path: Path) -> None:
    """The whole stack (CLI, config, secrets, daemon): many kinds of bad traffic at once, then a clean exit.
    The bearer comes from ``{{secret:...}}`` and must never reach the daemon's log."""
    from tests.selfmcp.test_composition import worker

    pki = make_pki(tmp_path)
    limit = 64 * 1024
    argv = ["--serve-mcp", "https://127.0.0.1:0", "--serve-cert", str(pki.server.cert), "--serve-key",
            str(pki.server.key), "--serve-bearer", "{{secret:SERVE_TOKEN}}", "--serve-max-body", str(limit),
            "--intelligence", "test"]
    log: list[str] = []
    verify = pki.client_context(None)
    async with worker(argv, env={"SERVE_TOKEN": TOKEN}, stderr_lines=log) as url, \
            kept_serving(url, verify=verify, headers=AUTH) as probe, \
            httpx.AsyncClient(verify=verify, timeout=10, limits=httpx.Limits(max_connections=32)) as bad:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        good = {**ACCEPT, **AUTH, "mcp-session-id": probe.session, "mcp-protocol-version": "2025-11-25"}
        turn = 0

        async def attack() -> None:
            nonlocal turn
            turn += 1
            kind = turn % 5
            if kind == 0:
                r = await bad.post(url, headers={**ACCEPT, "authorization": "Bearer nope"}, json=INIT)
                _error(r, 401, -32600, "Unauthorized")
                assert r.headers["www-authenticate"] == 'Bearer realm="agentd"'
            elif kind == 1:
                r = await bad.post(url, headers={**good, "origin": "https://evil.example.com"}, json=INIT)
                _error(r, 403, -32600, "Forbidden: Origin not allowed")
            elif kind == 2:
                r = await bad.post(url, headers=good, content=b"x" * (2 * limit))
                _error(r, 413, -32600, f"request body exceeds {limit} bytes")
            elif kind == 3:
                r = await bad.post(url, headers=good, content=b'{"jsonrpc":')
                _error(r, 400, -32700)
            else:
                r = await bad.post(url, headers=good, json=rpc("resources/read", {"uri": 42}, 3))
                _error(r, 200, -32602)
            # and plain HTTP to the TLS port, each time
            sock = await trio.open_tcp_stream("127.0.0.1", port)
            async with sock:
                await sock.send_all(REQUEST)
                with trio.fail_after(10):
                    try:
                        assert await sock.receive_some(4096) == b""
                    except trio.BrokenResourceError:
                        pass

        made = await hammer(probe, attack, parallel=12, rounds=10, timeout=30)
        assert made >= 12
        async with httpx.AsyncClient(verify=verify, timeout=10) as fresh:
            peer = LegacyPeer(fresh, url, headers=AUTH)
            await peer.initialize()
            assert "run_id" in (await peer.call("tools/call", {"name": "status", "arguments": {}}))[
                "result"]["structuredContent"]
    # the worker exited 0 on SIGTERM (checked by ``worker``); the token never reached its log
    assert log and not any(TOKEN in line for line in log)

# -- the harness itself can fail ---------------------------------------------------------------------------


async def test_the_probe_fails_when_the_server_stalls() -> None:
    async with serving() as s:
        real = s.surface.handle

        async def stalled(request: Any, ctx: Any) -> Any:
            if request.method == "tools/call" and stall.is_set():
                await trio.sleep(1.0)  # real time: the served handler stalls past the real probe's max gap
            return await real(request, ctx)

        stall = trio.Event()
        s.surface.handle = stalled  # type: ignore[method-assign]
        with pytest.raises(AssertionError, match=r"ReadTimeout|waited"):
            async with kept_serving(s.url, max_gap=0.4) as probe:
                with trio.fail_after(5):
                    await probe.wait_rounds(3)
                stall.set()
                await trio.sleep(0.6)  # real time: longer than the probe's 0.4 s gap, on its clock


async def test_the_probe_fails_when_the_server_goes_away() -> None:
    async with serving() as s:
        with pytest.raises(AssertionError):
            async with kept_serving(s.url, max_gap=1.0) as probe:
                with trio.fail_after(5):
                    await probe.wait_rounds(3)
                s.stop.set()  # drain: the listener closes, the probe's next round fails
                await until(lambda: probe.failures, timeout=5, what="the probe's failure")


# -- the rest of a refused body: read, but bounded (in memory, on the autojump clock) -----------------------


async def _refuse_oversized(declared: int | None, *, dribble: float) -> tuple[int, int, float]:
    """POST a body past a 1 KiB limit; the peer sends 1 KiB every ``dribble`` seconds, forever.

    Returns (status, bytes the app read, seconds until the 413 went out)."""
    read = 0
    async with trio.open_nursery() as surface_nursery:
        surface = SelfMcpSurface(TaskBackend(surface_nursery), AgentInfo("r", "loop"))
        await surface_nursery.start(surface.run)
        app = McpAsgiApp(surface, AsgiOptions(max_body=1024))
        headers = [(b"host", b"127.0.0.1:1"), (b"content-type", b"application/json")]
        if declared is not None:
            headers.append((b"content-length", str(declared).encode()))
        scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            nonlocal read
            await trio.sleep(dribble)  # virtual time: the peer's pace, in the autojump_clock test below
            read += 1024
            return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        started = trio.current_time()
        with trio.fail_after(60):
            await app(scope, receive, send)
        took = trio.current_time() - started
        surface_nursery.cancel_scope.cancel()
    return int(sent[0]["status"]), read, took


async def test_refused_body_is_discarded_within_bounds(autojump_clock: object) -> None:
    # a fast peer: the rest is read up to DISCARD_MAX, then the 413 goes out anyway
    status, read, _ = await _refuse_oversized(None, dribble=0.0001)
    assert status == 413 and DISCARD_MAX <= read <= DISCARD_MAX + 4096
    # a slow peer: the 413 goes out after DISCARD_TIME, not after the 30 s body timeout
    status, read, took = await _refuse_oversized(None, dribble=0.5)
    assert status == 413 and DISCARD_TIME <= took <= DISCARD_TIME + 1
    # a body declared larger than DISCARD_MAX is not read at all
    status, read, took = await _refuse_oversized(DISCARD_MAX + 1, dribble=0.5)
    assert (status, read, took) == (413, 0, 0)
