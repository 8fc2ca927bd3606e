"""``agentd check --intelligence``: the gateway is checked like the MCP servers, through the real CLI against a
real gateway on loopback (plain and TLS with a private CA) and a real dead proxy; one hint per failure."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from tests.cli.helpers import clean_env
from tests.peers.gateway import closed_port, scripted_gateway
from tests.selfmcp.certs import make_pki

KEY = "gw-Key-7Hq2Lm9Vx4Rt8Zp3"
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
              "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR")


@attrs.frozen
class Checked:
    code: int
    document: dict[str, Any]
    stdout: str
    stderr: str

    @property
    def gateway(self) -> dict[str, Any]:
        (endpoint,) = self.document["intelligence"]["endpoints"]
        return endpoint  # type: ignore[no-any-return]


async def check(args: Sequence[str], env: Mapping[str, str] | None = None) -> Checked:
    base = {k: v for k, v in clean_env().items() if k not in PROXY_VARS}
    proc = await trio.run_process([sys.executable, "-m", "agentd", "check", *args], env={**base, **(env or {})},
                                  stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
    stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
    assert stdout.count("\n") == 1, stdout  # one JSON document, whatever happened
    return Checked(proc.returncode, json.loads(stdout), stdout, stderr)


def token_args() -> list[str]:
    return ["--intelligence-token", "{{secret:GW_KEY}}"]


async def test_a_good_gateway_token_and_model_pass_and_the_key_is_never_shown() -> None:
    with trio.fail_after(60):
        async with scripted_gateway(models=["gpt-4o", "gpt-4o-mini"], token=KEY) as gw:
            done = await check(["--intelligence", gw.url, "--model", "gpt-4o-mini", *token_args(),
                                "--log-level", "debug"], {"GW_KEY": KEY})
            assert [(r.method, r.path) for r in gw.app.requests] == [("GET", "/v1/models")]
    assert done.code == 0, done.stderr
    assert done.document["ok"] is True and done.document["intelligence"]["model"] == "gpt-4o-mini"
    assert done.gateway | {"endpoint": None} == {
        "endpoint": None, "ok": True, "reachable": True, "tls": None, "token": "accepted", "modelKnown": True,
        "error": None, "hint": None}
    assert KEY not in done.stdout + done.stderr


async def test_a_rejected_token_is_exit_4_at_the_first_answer_with_its_hint() -> None:
    with trio.fail_after(60):
        async with scripted_gateway(models=["m"], token=KEY) as gw:
            done = await check(["--intelligence", gw.url, "--model", "m", *token_args()], {"GW_KEY": "wrong-key-123"})
            assert len(gw.app.requests) == 1  # a check does not retry
    assert done.code == 4 and done.document["ok"] is False
    assert done.gateway["token"] == "rejected" and "HTTP 401" in done.gateway["error"]
    assert "--intelligence-token" in done.gateway["hint"]
    assert "wrong-key-123" not in done.stdout + done.stderr


async def test_no_token_where_one_is_wanted_says_how_to_give_one() -> None:
    with trio.fail_after(60):
        async with scripted_gateway(models=["m"], token=KEY) as gw:
            done = await check(["--intelligence", gw.url, "--model", "m"])
    assert done.code == 4 and done.gateway["token"] == "none"
    assert "--intelligence-token-file" in done.gateway["hint"]


async def test_an_unknown_model_is_exit_4_with_the_closest_name() -> None:
    with trio.fail_after(60):
        async with scripted_gateway(models=["gpt-4o", "gpt-4o-mini", "o3"]) as gw:
            done = await check(["--intelligence", gw.url, "--model", "gpt-4o-mnii"])
    assert done.code == 4
    assert done.gateway["modelKnown"] is False and done.gateway["hint"] == "did you mean --model gpt-4o-mini?"


async def test_a_gateway_without_a_models_list_is_reachable_and_the_model_unchecked() -> None:
    with trio.fail_after(60):
        async with scripted_gateway() as gw:
            done = await check(["--intelligence", gw.url, "--model", "anything"])
    assert done.code == 0 and done.gateway["reachable"] is True and done.gateway["modelKnown"] is None


async def test_an_untrusted_certificate_names_ssl_cert_file_once_and_a_trusted_one_passes(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    with trio.fail_after(60):
        async with scripted_gateway(models=["m"], certfile=str(pki.server.cert), keyfile=str(pki.server.key)) as gw:
            refused = await check(["--intelligence", gw.url, "--model", "m"])
            trusted = await check(["--intelligence", gw.url, "--model", "m"], {"SSL_CERT_FILE": str(pki.ca)})
    assert refused.code == 4 and refused.gateway["tls"] == "failed"
    assert "SSL_CERT_FILE" in refused.gateway["hint"] and "--tls-ca applies to MCP servers" in refused.gateway["hint"]
    assert trusted.code == 0 and trusted.gateway["tls"] == "verified" and trusted.gateway["modelKnown"] is True


async def test_a_dead_proxy_is_named() -> None:
    proxy = f"http://127.0.0.1:{closed_port()}"
    with trio.fail_after(60):
        done = await check(["--intelligence", "https://gw.example.test/v1", "--model", "m"],
                           {"HTTPS_PROXY": proxy})
    assert done.code == 4 and done.gateway["reachable"] is False
    assert proxy in done.gateway["hint"] and "NO_PROXY" in done.gateway["hint"]


async def test_mcp_failure_keeps_exit_6_and_the_offline_model_needs_no_check() -> None:
    port = closed_port()
    with trio.fail_after(60):
        done = await check(["--mcp", f"gone=http://127.0.0.1:{port}/mcp", "--intelligence", "test"])
    assert done.code == 6
    assert done.document["intelligence"]["endpoints"] == [{"endpoint": "test", "ok": True, "offline": True}]


async def test_a_bad_endpoint_or_an_unset_token_is_exit_2_before_anything_connects() -> None:
    with trio.fail_after(60):
        proc = await trio.run_process(
            [sys.executable, "-m", "agentd", "check", "--intelligence", "https://gw.example/v1", *token_args()],
            env={k: v for k, v in clean_env().items() if k != "GW_KEY"}, capture_stdout=True, capture_stderr=True,
            check=False)
    assert proc.returncode == 2 and proc.stdout == b""
    assert b"GW_KEY" in proc.stderr


async def test_a_run_against_an_untrusted_gateway_is_not_retried_and_says_what_to_trust(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    base = {k: v for k, v in clean_env().items() if k not in PROXY_VARS}
    with trio.fail_after(60):
        async with scripted_gateway(certfile=str(pki.server.cert), keyfile=str(pki.server.key)) as gw:
            proc = await trio.run_process(
                [sys.executable, "-m", "agentd", "--instruction", "x", "--intelligence", gw.url, "--log-format",
                 "json"], env=base, stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
    assert proc.returncode == 4
    events = [json.loads(line) for line in proc.stderr.decode().splitlines() if line.startswith("{")]
    assert [e for e in events if e["event"] == "intel.retry"] == []  # the certificate will not verify in a second
    assert len([e for e in events if e["event"] == "intel.call"]) == 1
    error = next(e for e in events if e["event"] == "run.end")["error"]
    assert "TLS certificate verification failed" in error and "SSL_CERT_FILE" in error
