"""OAuth and client-credentials connections outside ``agentd run``: a plain parent agentd reaching an
OAuth-protected child agentd.

Real parts only: a small authorization server (tests/security/idp.py), a real child ``agentd --serve-mcp``
that accepts only its access tokens (``--serve-oauth-issuer``), the scripted gateway, and the parent as a
real ``agentd`` process: a ``--mode loop`` daemon with a ``client_credentials`` connection (discovery once,
a token renewed before it expires, the secret nowhere in its output), and a ``--serve-mcp`` worker whose
served spawn (a child agentd of its own) uses an ``oauth`` connection through ``--runtime-module``: the
credential it got already past its expiry is invalidated with ``reason: "expired"`` and asked for again.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from agentd.config import McpServerConfig
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.integration.agents import agentd_worker, text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.security.idp import idp

SCOPE = "agent.run"
SECRET = "cc-secret-value-7f3a9c21e4"


def _child_argv(issuer: str) -> list[str]:
    return ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-oauth-issuer", issuer, "--serve-oauth-scope", SCOPE,
            "--intelligence", "test", "--drain-timeout", "5"]


def _host(tmp_path: Path, child_url: str, auth: dict[str, Any]) -> Path:
    path = tmp_path / "host.yaml"
    path.write_text(yaml.safe_dump({"version": "1.0", "connections": {"child": {
        "url": child_url, "auth": auth, "mode": "read", "tools": ["status"], "readTools": ["status"]}}},
        sort_keys=False))  # fmt: skip
    return path


def _tool_texts(request: RecordedRequest) -> list[str]:
    return [text_of(m.get("content")) for m in request.messages if m.get("role") == "tool"]


def _check_child(request: RecordedRequest) -> dict[str, Any]:
    """Each run: call the child's ``status`` once, then answer with what it said."""
    if not _tool_texts(request):
        return tool_call("child__status", {})
    return text("", echo_last=True)


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
async def test_loop_daemon_reaches_an_oauth_protected_child_with_client_credentials(tmp_path: Path) -> None:
    # A 30 s token is inside the 60 s renewal window: every later request renews it first, never a 401.
    async with idp(client_secret=SECRET, expires_in=30) as authority, scripted_gateway(default=_check_child) as gw:
        async with agentd_worker(_child_argv(authority.issuer)) as child:
            host = _host(tmp_path, child.url, {
                "type": "client_credentials", "clientId": {"env": "CHILD_CLIENT_ID"},
                "clientSecret": {"env": "CHILD_CLIENT_SECRET"}, "scopes": [SCOPE]})  # fmt: skip
            argv = ["--config", str(host), "--mode", "loop", "--interval", "0", "--intelligence", gw.url,
                    "--instruction", "PARENT-TASK: check the child", "--drain-timeout", "5"]
            env = {"CHILD_CLIENT_ID": authority.client_id, "CHILD_CLIENT_SECRET": SECRET}
            async with agentd_worker(argv, env=env, serving=False) as parent:
                with trio.fail_after(60):  # two runs of the loop, each reaching the child
                    await parent.wait_event(lambda _: len(parent.named("run.end")) >= 2)
                parent.drain()
            assert parent.returncode == 0, parent.events[-5:]
    ends = parent.named("run.end")
    assert [e["status"] for e in ends[:2]] == ["completed", "completed"], ends
    # The model saw the child's answer each time (the call went through the child's OAuth gate).
    observed = [t for r in gw.requests for t in _tool_texts(r)]
    assert len(observed) >= 2 and all("error" not in t.lower()[:40] for t in observed), observed
    # Discovery once for the process; then a token request before each later request (the token's expiry).
    auth = parent.named("connection.auth")
    discovered = [e for e in auth if e.get("status") == "discovered"]
    assert len(discovered) == 1 and discovered[0]["connection"] == "child", auth
    assert len(authority.token_requests) >= 3
    for form in authority.token_requests:
        assert form["grant_type"] == "client_credentials" and form["scope"] == SCOPE
        assert form["resource"] == child.url
    assert not [e for e in auth if e.get("status") == "refused"]
    # The secret and the tokens stay out of everything the parent printed.
    printed = json.dumps(parent.events) + parent.stdout.decode()
    assert SECRET not in printed
    assert "eyJ" not in printed  # no JWT (access token or header) in any line


def _runtime_module(tmp_path: Path, expired: str, fresh: str) -> Path:
    """A runtime module whose provider hands out a credential already past its expiry first, a valid one when
    asked again with ``forceRefresh``; every call is appended to ``calls.jsonl`` beside it."""
    calls = tmp_path / "calls.jsonl"
    path = tmp_path / "runtime.py"
    path.write_text(textwrap.dedent(f"""
        import json
        import time

        CALLS = {str(calls)!r}


        def _note(kind, request):
            with open(CALLS, "a") as out:
                out.write(json.dumps({{"call": kind, "profile": request["credentialProfile"],
                                      "force": request["forceRefresh"], "reason": request.get("reason")}}) + "\\n")


        class connection_credentials:
            @staticmethod
            async def get_credential(request):
                _note("get", request)
                if not request.forceRefresh:
                    return {{"status": "ready", "headers": {{"Authorization": "Bearer {expired}"}},
                             "expiresAt": time.time() - 5}}
                return {{"status": "ready", "headers": {{"Authorization": "Bearer {fresh}"}},
                         "expiresAt": time.time() + 3600}}

            @staticmethod
            def invalidate_credential(request):
                _note("invalidate", request)
    """))
    return path


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
async def test_served_spawn_uses_an_oauth_connection_and_invalidates_an_expired_credential(tmp_path: Path) -> None:
    from agentd.client import open_mcp_pool

    async with idp() as authority, scripted_gateway(default=_check_child) as gw:
        async with agentd_worker(_child_argv(authority.issuer)) as child:
            # Both tokens are good for the child (its audience and scope); the provider says the first expired.
            first = authority.mint(aud=child.url, scope=SCOPE, sub="parent-user")
            second = authority.mint(aud=child.url, scope=SCOPE, sub="parent-user", jti="second")
            module = _runtime_module(tmp_path, first, second)
            host = _host(tmp_path, child.url, {"type": "oauth", "profile": "child-agent"})
            argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--config", str(host), "--runtime-module", str(module),
                    "--intelligence", gw.url, "--drain-timeout", "5"]
            async with agentd_worker(argv) as parent:
                log = EventLog(sink=lambda line: None)
                with trio.fail_after(60):
                    async with open_mcp_pool([McpServerConfig(name="parent", url=parent.url)], log=log,
                                             secrets=SecretResolver(env={}), run_id="test") as pool:
                        spawned = await pool.call_tool("parent", "subagent.spawn",
                                                       {"instruction": "SPAWNED-TASK: check the child"})
            assert parent.returncode == 0
    assert spawned.is_error is False, spawned
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert calls == [
        {"call": "get", "profile": "child-agent", "force": False, "reason": None},
        {"call": "invalidate", "profile": "child-agent", "force": False, "reason": "expired"},
        {"call": "get", "profile": "child-agent", "force": True, "reason": None},
    ], calls
    observed = [t for r in gw.requests for t in _tool_texts(r)]
    assert len(observed) == 1 and "error" not in observed[0].lower()[:40], observed
    printed = json.dumps(parent.events) + parent.stdout.decode()
    assert first not in printed and second not in printed


@pytest.mark.slow
async def test_agentd_check_lists_an_oauth_protected_child_through_client_credentials(tmp_path: Path) -> None:
    from tests.integration.agents import run_agentd

    async with idp(client_secret=SECRET) as authority, agentd_worker(_child_argv(authority.issuer)) as child:
        host = _host(tmp_path, child.url, {
            "type": "client_credentials", "clientId": {"env": "CHILD_CLIENT_ID"},
            "clientSecret": {"env": "CHILD_CLIENT_SECRET"}, "scopes": [SCOPE]})  # fmt: skip
        env = {"CHILD_CLIENT_ID": authority.client_id, "CHILD_CLIENT_SECRET": SECRET}
        done = await run_agentd(["check", "--config", str(host), "--output", "json"], env=env)
        wrong = await run_agentd(["check", "--config", str(host), "--output", "json"],
                                 env={**env, "CHILD_CLIENT_SECRET": "not-the-secret-0000"})
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    doc = json.loads(done.stdout)
    assert doc["ok"] is True, doc
    assert len(authority.token_requests) >= 1
    # A refused token request is that server's failure (exit 6), naming the connection, never the secret.
    assert wrong.returncode == 6, wrong.stderr.decode()[-2000:]
    said = wrong.stdout.decode() + wrong.stderr.decode()
    assert "the token endpoint answered HTTP 401 (invalid_client)" in said
    assert "not-the-secret-0000" not in said and SECRET not in said
