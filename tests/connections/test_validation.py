"""Every validation failure names its exact path and is exit 2, before any side effect."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentd.config.host import load_host
from agentd.connections.plan import bind, load_manifest
from agentd.errors import ConfigError
from tests.connections.helpers import connection, write

URL = "http://127.0.0.1:9/mcp"


def host_with(**conn):
    base = {
        "url": URL,
        "tools": ["search", "read", "delete"],
        "readTools": ["search", "read"],
        "mode": "read_write",
    }
    base.update(conn)
    return {"version": "1.0", "connections": {"docs": connection(**base)}}


def manifest_with(binding=None, steps=None, **extra):
    return {
        "connections": [binding or {"ref": "docs", "alias": "d"}],
        "steps": steps or [{"id": "s", "type": "prompt", "prompt": "p", "tools": ["d__search"]}],
        **extra,
    }


def check(tmp_path, host, manifest, env=None, app_tools=()):
    h = load_host(str(write(tmp_path, "host.yaml", host)), env or {})
    m = load_manifest(str(write(tmp_path, "agent.yaml", manifest)))
    return bind(h, m, application_tools=app_tools)


def fails(tmp_path, host, manifest, *, env=None, app_tools=()):
    with pytest.raises(ConfigError) as info:
        check(tmp_path, host, manifest, env, app_tools)
    return str(info.value)


@pytest.mark.parametrize(
    ("host", "manifest", "expected"),
    [
        (host_with(tolls=[]), manifest_with(), "extra fields found (tolls) @ $.connections['docs']"),
        (host_with(), manifest_with({"ref": "docs", "alias": "d", "tols": []}), "@ $.connections[0]"),
        (
            host_with(),
            manifest_with({"ref": "nope", "alias": "d"}),
            "required connection 'nope' is not configured by the host (configured: docs) @ $.connections[0].ref",
        ),
        (
            host_with(),
            manifest_with({"ref": "docs", "alias": "d", "tools": ["search", "drop"]}),
            "tool 'drop' is not in the host's allowlist for 'docs' @ $.connections[0].tools[1]",
        ),
        (
            host_with(mode="read"),
            manifest_with({"ref": "docs", "alias": "d", "mode": "read_write"}),
            "cannot elevate read to read_write @ $.connections[0].mode",
        ),
        (
            host_with(),
            manifest_with({"ref": "docs", "alias": "d", "mode": "read", "tools": ["delete"]}),
            "'delete' is not classified read-only (readTools) for 'docs'; a read binding cannot offer it "
            "@ $.connections[0].tools[0]",
        ),
        (
            host_with(),
            manifest_with(
                {"ref": "docs", "alias": "d", "tools": ["search"]},
                steps=[{"id": "s", "prompt": "p", "tools": ["d__read"]}],
            ),
            "binding 'd' does not provide 'read' (it offers: search) @ $.steps[0].tools[0]",
        ),
        (
            host_with(),
            manifest_with(steps=[{"id": "s", "prompt": "p", "tools": ["other__x"]}]),
            "step tool 'other__x' is provided by no binding and no application tool @ $.steps[0].tools[0]",
        ),
        (
            host_with(auth={"type": "bearer", "token": "literal-token-value"}),
            manifest_with(),
            "not a literal str (literal secrets are not accepted) @ $.connections['docs'].auth.token",
        ),
        (
            host_with(headers={"Authorization": "Bearer abcdefghijklmnopqrstuvwxyz012345"}),
            manifest_with(),
            "@ $.connections.docs.headers.Authorization",
        ),
        (
            host_with(auth={"type": "client_credentials", "clientId": "abc", "clientSecret": {"env": "S"}}),
            manifest_with(),
            "@ $.connections['docs'].auth.clientId",
        ),
        (
            host_with(mode="write"),
            manifest_with(),
            "expected one of 'read', 'read_write', got 'write' @ $.connections['docs'].mode",
        ),
        (host_with(readTools=["zap"]), manifest_with(), "readTools names 'zap', which is not in tools"),
        (
            host_with(),
            manifest_with(limits={"maxToolCallsPerIteration": 0}),
            "maxToolCallsPerIteration must be at least 1 @ $.limits.maxToolCallsPerIteration",
        ),
        (host_with(), manifest_with({"ref": "docs", "alias": "a__b"}), "never '__'"),
        ({**host_with(), "intelligence": {"url": "http://127.0.0.1:9/v1", "key": "sk-literal-key-value"}},
         manifest_with(), "not a literal str (literal secrets are not accepted) @ $.intelligence.key"),
        (
            host_with(),
            manifest_with(steps=[{"id": "s", "type": "shell", "prompt": "p"}]),
            "expected one of 'prompt', got 'shell' @ $.steps[0].type",
        ),
    ],
)
def test_failure_names_its_path(tmp_path, host, manifest, expected):
    assert expected in fails(tmp_path, host, manifest)


def test_missing_env_reference_is_exit_2_with_path(tmp_path):
    host = host_with(url={"env": "DOCS_URL"}, auth={"type": "bearer", "token": {"env": "DOCS_TOKEN"}})
    message = fails(tmp_path, host, manifest_with(), env={"DOCS_URL": URL})
    assert "environment variable DOCS_TOKEN is not set @ $.connections.docs.auth.token" in message
    plan = check(tmp_path, host, manifest_with(), env={"DOCS_URL": URL, "DOCS_TOKEN": "t0k3n-value"})
    server = plan.bound[0].server_config()
    assert server.url == URL and server.headers["Authorization"] == "Bearer {{secret:DOCS_TOKEN}}"


def test_optional_unconfigured_binding_is_skipped(tmp_path):
    manifest = manifest_with(steps=[{"id": "s", "prompt": "p", "tools": ["d__search", "extra__x"]}])
    manifest["connections"].append({"ref": "missing", "alias": "extra", "required": False})
    plan = check(tmp_path, host_with(), manifest)
    assert [b.alias for b in plan.bound] == ["d"] and plan.skipped == ("extra",)


def test_application_tool_clash_and_names(tmp_path):
    steps = [{"id": "s", "prompt": "p", "tools": ["lookup_status"]}]
    assert check(tmp_path, host_with(), manifest_with(steps=steps), app_tools=["lookup_status"])
    message = fails(tmp_path, host_with(), manifest_with(), app_tools=["d__search"])
    assert "application tool 'd__search' clashes with the tools of connection alias 'd'" in message


def test_every_problem_is_reported_at_once(tmp_path):
    manifest = manifest_with(
        {"ref": "docs", "alias": "d", "tools": ["nope"]},
        steps=[{"id": "s", "prompt": "p", "tools": ["zz__y"]}],
    )
    message = fails(tmp_path, host_with(), manifest)
    assert "$.connections[0].tools[0]" in message and "$.steps[0].tools[0]" in message


def test_mcp_servers_list_and_flags_map_into_one_model(tmp_path):
    host = host_with()
    host["mcp_servers"] = [{"name": "legacy", "url": "http://127.0.0.1:9/legacy", "call_timeout": "5s"}]
    h = load_host(str(write(tmp_path, "host.yaml", host)), {})
    legacy = h.connections["legacy"]
    assert legacy.tools is None and legacy.mode == "read_write" and legacy.call_timeout == 5.0
    assert legacy.source == "mcp_servers"
    manifest = manifest_with(
        {"ref": "legacy", "alias": "lg"}, steps=[{"id": "s", "prompt": "p", "tools": ["lg__any"]}]
    )
    m = load_manifest(str(write(tmp_path, "agent.yaml", manifest)))
    assert bind(h, m).bound[0].offers("any")


def test_cli_exit_2_before_side_effects(tmp_path):
    """A bad manifest exits 2 with the path on stderr; the transcript store is never created."""
    db = tmp_path / "t.sqlite3"
    host = host_with()
    host["transcript"] = {"path": str(db)}
    host["intelligence"] = {"url": "http://127.0.0.1:9/v1"}
    manifest = manifest_with({"ref": "docs", "alias": "d", "mode": "read", "tools": ["delete"]})
    argv = [
        sys.executable,
        "-m",
        "agentd",
        "run",
        str(write(tmp_path, "agent.yaml", manifest)),
        "--config",
        str(write(tmp_path, "host.yaml", host)),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT")}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=os.getcwd())
    assert proc.returncode == 2, proc.stderr
    lines = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
    assert any("$.connections[0].tools[0]" in line.get("error", "") for line in lines), proc.stderr
    assert proc.stdout == ""
    assert not db.exists()
