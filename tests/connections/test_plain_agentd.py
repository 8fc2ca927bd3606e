"""Plain ``agentd --config host.yaml``: the host file's ``connections:`` map and ``intelligence`` mapping run
exactly as ``agentd run`` binds them (name__tool, allowlists after mode, bearer auth), merged with ``--mcp``."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

import agentd
from agentd.config import Config
from agentd.config.load import load_config
from agentd.config.model import IntelligenceConfig
from agentd.errors import ConfigError
from agentd.telemetry.events import EventLog
from tests.cli.helpers import assert_untouched, run_agentd, tripwire
from tests.connections.peer import mcp_peer
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text, tool_call


@pytest.fixture(scope="module")
def sdk_peer() -> Iterator[launch.PeerProcess]:
    with launch.start_peer(launch.sdk_server_argv()) as started:
        yield started


def _host(tmp_path: Path, doc: Mapping[str, Any]) -> str:
    path = tmp_path / "host.yaml"
    path.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
    return str(path)


def _mcp_tools(names: list[str], prefix: str) -> list[str]:
    return sorted(n for n in names if n.startswith(prefix))


async def _run(cfg: Config, env: Mapping[str, str]) -> tuple[agentd.RunResult, list[dict[str, Any]]]:
    lines: list[dict[str, Any]] = []
    with trio.fail_after(30):
        result = await agentd.main(cfg, log=EventLog(sink=lines.append), env=env)
    return result, lines


@pytest.mark.interop
@pytest.mark.parametrize(("mode", "offered"), [("read", ["sdk__echo"]), ("read_write", ["sdk__add", "sdk__echo"])])
async def test_sdk_peer_only_allowed_tools_reach_the_model(
    tmp_path: Path, sdk_peer: launch.PeerProcess, mode: str, offered: list[str]
) -> None:
    env = {"GW_URL": "", "GW_KEY": "gw-key-0123456789"}
    async with scripted_gateway([tool_call("sdk__echo", {"text": "via host"}), text("done")]) as gw:
        env["GW_URL"] = gw.url
        host = _host(tmp_path, {
            "version": "1.0",
            "intelligence": {"url": {"env": "GW_URL"}, "model": "host-model", "key": {"env": "GW_KEY"}},
            "connections": {"sdk": {"url": sdk_peer.url, "mode": mode, "tools": ["echo", "add"],
                                    "readTools": ["echo"]}},
            "transcript": {"enabled": False},
        })
        cfg = load_config(["--config", host, "--instruction", "use the tools"], env=env)
        result, _ = await _run(cfg, env)
    assert result.status is agentd.RunStatus.COMPLETED, result
    assert _mcp_tools(gw.requests[0].tool_names, "sdk__") == offered
    assert gw.requests[0].body["model"] == "host-model"
    assert gw.requests[0].headers.get("authorization") == "Bearer gw-key-0123456789"
    observation = [m["content"] for m in gw.requests[1].messages if m["role"] == "tool"]
    assert observation == ["via host"]


async def test_bearer_auth_and_a_disallowed_call_never_reaches_the_server(tmp_path: Path) -> None:
    token = "docs-token-0123456789"
    async with (
        mcp_peer(bearer=f"Bearer {token}") as peer,
        scripted_gateway([tool_call("docs__delete", {"id": "1"}), tool_call("docs__search", {"q": "x"}),
                          text("done")]) as gw,
    ):
        env = {"DOCS_TOKEN": token}
        host = _host(tmp_path, {
            "intelligence": {"url": gw.url},
            "connections": {"docs": {"driver": "mcp", "transport": "streamable-http", "url": f"{peer.origin}/mcp",
                                     "auth": {"type": "bearer", "token": {"env": "DOCS_TOKEN"}},
                                     "mode": "read_write", "tools": ["search", "read"]}},
        })
        cfg = load_config(["--config", host, "--instruction", "go"], env=env)
        result, lines = await _run(cfg, env)
    assert result.status is agentd.RunStatus.COMPLETED, result
    assert _mcp_tools(gw.requests[0].tool_names, "docs__") == ["docs__read", "docs__search"]
    assert peer.calls == [{"name": "search", "arguments": {"q": "x"}}]  # delete was never sent
    refused = next(m["content"] for m in gw.requests[1].messages if m["role"] == "tool")
    assert "docs__delete" in refused
    assert all(h.get("authorization") == f"Bearer {token}" for h in peer.headers_seen)
    assert token not in json.dumps(lines)


async def test_mcp_flag_merges_with_the_connections(tmp_path: Path, sdk_peer: launch.PeerProcess) -> None:
    async with mcp_peer() as peer, scripted_gateway([text("done")]) as gw:
        host = _host(tmp_path, {
            "intelligence": {"url": gw.url},
            "connections": {"docs": {"url": f"{peer.origin}/mcp", "tools": ["search"], "readTools": ["search"]}},
        })
        cfg = load_config(["--config", host, "--instruction", "go", "--mcp", f"sdk={sdk_peer.url}"], env={})
        assert [s.name for s in cfg.mcp] == ["docs", "sdk"]
        assert (cfg.server("docs").tools, cfg.server("sdk").tools) == (("search",), None)
        result, _ = await _run(cfg, {})
    assert result.status is agentd.RunStatus.COMPLETED
    names = gw.requests[0].tool_names
    assert _mcp_tools(names, "docs__") == ["docs__search"]
    assert "sdk__echo" in names and "sdk__slow" in names  # an --mcp server offers everything it lists


def test_same_url_mcp_flag_keeps_the_allowlist_and_conflict_is_2(tmp_path: Path) -> None:
    host = _host(tmp_path, {"connections": {"docs": {"url": "http://127.0.0.1:9/mcp", "tools": ["a"],
                                                     "readTools": ["a"]}}})
    same = load_config(["--config", host, "--instruction", "x", "--intelligence", "test",
                             "--mcp", "docs=http://127.0.0.1:9/mcp"], env={})
    assert same.server("docs").tools == ("a",)
    with tripwire() as sock:
        port = sock.getsockname()[1]
        outcome = run_agentd(["--config", host, "--instruction", "x", "--intelligence", f"http://127.0.0.1:{port}/v1",
                              "--mcp", f"docs=http://127.0.0.1:{port}/other"])
        assert outcome.code == 2 and outcome.stdout == ""
        assert "conflicts" in outcome.stderr and "docs" in outcome.stderr
        assert_untouched(sock)


@pytest.mark.parametrize(("connection", "env", "message"), [
    ({"tools": ["search"], "readTools": ["search", "read"]}, {},
     "readTools names 'read', which is not in tools @ $.connections.docs.readTools[1]"),
    ({"readTools": ["search"]}, {}, "required field missing @ $.connections['docs'].tools"),
    ({"tools": ["search"], "auth": {"type": "bearer", "token": {"env": "NOPE_TOKEN"}}}, {},
     "environment variable NOPE_TOKEN is not set @ $.connections.docs.auth.token"),
    ({"tools": ["search"], "auth": {"type": "bearer", "token": "literal-secret-123456"}}, {},
     "literal secrets are not accepted) @ $.connections['docs'].auth.token"),
    ({"tools": ["search"], "mode": "write"}, {}, "got 'write' @ $.connections['docs'].mode"),
    ({"tools": ["search"], "auth": {"type": "oauth", "profile": "p"}}, {},
     "connection 'docs' uses auth type oauth: give --runtime-module PATH"),
    ({"tools": ["search"], "auth": {"type": "client_credentials", "clientId": {"env": "CC_ID"},
                                    "clientSecret": {"env": "CC_SECRET_MISSING"}}}, {"CC_ID": "agent"},
     "environment variable CC_SECRET_MISSING is not set @ $.connections.docs.auth.clientSecret"),
])
def test_validation_errors_name_their_path_and_exit_2_before_side_effects(
    tmp_path: Path, connection: dict[str, Any], env: dict[str, str], message: str
) -> None:
    with tripwire() as sock:
        port = sock.getsockname()[1]
        host = _host(tmp_path, {"connections": {"docs": {"url": f"http://127.0.0.1:{port}/mcp", **connection}}})
        outcome = run_agentd(["--config", host, "--instruction", "x", "--intelligence",
                              f"http://127.0.0.1:{port}/v1"], env=env)
        assert outcome.code == 2 and outcome.stdout == "", outcome
        assert message in outcome.stderr, outcome.stderr
        assert "literal-secret-123456" not in outcome.stderr
        assert_untouched(sock)


def test_host_keys_in_process_errors(tmp_path: Path) -> None:
    bad_name = _host(tmp_path, {"connections": {"my__docs": {"url": "http://127.0.0.1:9/mcp", "tools": []}}})
    with pytest.raises(ConfigError, match=r"never '__'.* @ \$\.connections\.my__docs"):
        load_config(["--config", bad_name, "--instruction", "x", "--intelligence", "test"], env={})
    unset = _host(tmp_path, {"intelligence": {"url": {"env": "GW_URL_MISSING"}}})
    with pytest.raises(ConfigError, match=r"GW_URL_MISSING is not set @ \$\.intelligence\.url"):
        load_config(["--config", unset, "--instruction", "x"], env={})
    twice = _host(tmp_path, {"connections": {"docs": {"url": "http://127.0.0.1:9/mcp", "tools": []}},
                             "mcp_servers": [{"name": "docs", "url": "http://127.0.0.1:9/mcp"}]})
    with pytest.raises(ConfigError, match=r"'docs' is declared twice"):
        load_config(["--config", twice, "--instruction", "x", "--intelligence", "test"], env={})
    scalar = _host(tmp_path, {"intelligence": "test", "version": "1.0", "transcript": {"enabled": False}})
    assert load_config(["--config", scalar, "--instruction", "x"], env={}).intelligence.endpoints == ("test",)
    wrong_version = _host(tmp_path, {"version": 1})
    with pytest.raises(ConfigError, match=r"@ \$\.version"):
        load_config(["--config", wrong_version, "--instruction", "x", "--intelligence", "test"], env={})


def test_allowlist_travels_to_subagents() -> None:
    from agentd.supervisor.wiring import config_from_wire, config_to_wire

    cfg = Config(instruction="x", intelligence=IntelligenceConfig(endpoints=("test",)),
                 mcp=(agentd.config.model.McpServerConfig("docs", "http://127.0.0.1:9/mcp", tools=("search",)),))
    wire = json.loads(json.dumps(config_to_wire(cfg)))
    assert config_from_wire(wire).server("docs").tools == ("search",)
