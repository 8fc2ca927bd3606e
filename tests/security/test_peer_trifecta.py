"""The Rule of Two counts A2A peers: an untagged ``--a2a-peer`` brings untrusted input and external communication.

A real agentd whose catalogue is one MCP server holding sensitive data and one A2A peer (another real agentd,
``--serve-a2a``) exits 2 at start-up naming the Rule of Two and the peer; with ``--allow-trifecta`` it runs
(audited, the peer named); ``--a2a-peer-tags`` and ``a2a_peers: tags`` override the default; a spawn whose
narrowed scope holds the server and the peer is refused at the chokepoint.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio

from agentd.config.load import load_config
from agentd.errors import ConfigError
from agentd.security.rule_of_two import PEER_DEFAULT_TAGS, catalogue_tags
from agentd.supervisor.caps import Admission, Caps, Refusal, TreeLedger
from tests.durable.peer import counting_peer
from tests.integration.agents import ROOT, agentd_worker

pytestmark = [pytest.mark.usefixtures("no_leftover_children")]

REFUSED = (r"the MCP servers and A2A peers together bring untrusted input, sensitive data and external "
           r"communication \(Rule of Two; untrusted_input: helper; sensitive_data: crm; external_comms: helper\)"
           r".*--a2a-peer-tags.*--allow-trifecta")


def _argv(*extra: str, peer: str = "http://127.0.0.1:9", crm: str = "http://127.0.0.1:8/mcp") -> list[str]:
    return ["--instruction", "x", "--intelligence", "test", "--mcp", f"crm={crm}", "--mcp-tags", "crm=sensitive_data",
            "--a2a-peer", f"helper={peer}", *extra]


def test_an_untagged_peer_completes_the_trifecta_and_tags_override_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=REFUSED):
        load_config(_argv(), {})
    assert load_config(_argv("--allow-trifecta"), {}).allow_trifecta
    # The operator's word replaces the default: a peer that only answers (no external reach) is allowed.
    assert load_config(_argv("--a2a-peer-tags", "helper=untrusted_input"), {}).a2a_peers[0].tags == ("untrusted_input",)
    assert load_config(_argv("--a2a-peer-tags", "helper="), {}).a2a_peers[0].tags == ()
    # Without sensitive data the peer alone is two of three: allowed.
    assert load_config(["--instruction", "x", "--intelligence", "test", "--a2a-peer", "helper=http://127.0.0.1:9"], {})
    with pytest.raises(ConfigError, match="unknown tag 'secret'"):
        load_config(_argv("--a2a-peer-tags", "helper=secret"), {})
    with pytest.raises(ConfigError, match="--a2a-peer-tags nope: no such A2A peer"):
        load_config(_argv("--a2a-peer-tags", "nope=external_comms"), {})
    # The config file's a2a_peers entries take tags too.
    path = tmp_path / "agentd.yaml"
    path.write_text("a2a_peers:\n  - {name: helper, url: 'http://127.0.0.1:9', tags: [untrusted_input]}\n")
    config = load_config(["--config", str(path), "--instruction", "x", "--intelligence", "test",
                          "--mcp", "crm=http://127.0.0.1:8/mcp", "--mcp-tags", "crm=sensitive_data"], {})
    assert config.a2a_peers[0].tags == ("untrusted_input",)
    path.write_text("a2a_peers:\n  - {name: helper, url: 'http://127.0.0.1:9'}\n")
    with pytest.raises(ConfigError, match="Rule of Two"):
        load_config(["--config", str(path), "--instruction", "x", "--intelligence", "test",
                     "--mcp", "crm=http://127.0.0.1:8/mcp", "--mcp-tags", "crm=sensitive_data"], {})


def test_the_spawn_chokepoint_counts_the_peer_in_a_childs_scope() -> None:
    tags = catalogue_tags([("crm", ("sensitive_data",)), ("inbox", ("untrusted_input",))], [("helper", None)])
    assert tags["helper"] == PEER_DEFAULT_TAGS
    ledger = TreeLedger(Caps(), root_scope=frozenset(tags), server_tags=tags)
    refused = ledger.admit("0", ["crm", "helper"], 0.0)
    assert isinstance(refused, Refusal) and refused.cap == "rule_of_two"
    assert "untrusted_input: helper; sensitive_data: crm; external_comms: helper" in refused.message
    assert isinstance(ledger.admit("0", ["inbox", "helper"], 0.0), Admission)


async def _agentd(argv: list[str]) -> trio.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "AGENT_"))}
    with trio.fail_after(90):
        return await trio.run_process([sys.executable, "-m", "agentd", *argv], capture_stdout=True,
                                      capture_stderr=True, cwd=ROOT, env=env, check=False)


@pytest.mark.slow
async def test_a_real_run_with_a_peer_exits_2_unless_the_trifecta_is_allowed() -> None:
    async with counting_peer() as crm, agentd_worker(["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-a2a",
                                                      "--intelligence", "test"]) as helper:
        argv = _argv(peer=helper.url.removesuffix("/mcp"), crm=f"{crm.origin}/mcp")
        refused = await _agentd(argv)
        assert refused.returncode == 2, refused.stderr.decode()[-2000:]
        said = (refused.stdout + refused.stderr).decode()
        assert "Rule of Two" in said and "external_comms: helper" in said
        assert crm.received == []  # refused before any side effect: the server was never contacted

        allowed = await _agentd([*argv, "--allow-trifecta"])
        assert allowed.returncode == 0, allowed.stderr.decode()[-3000:]
        assert json.loads(allowed.stdout.decode().strip().splitlines()[-1])["status"] == "completed"
        events = [json.loads(line) for line in allowed.stderr.decode().splitlines() if line.startswith("{")]
        audit = [e for e in events if e["event"] == "security.trifecta_allowed"]
        assert len(audit) == 1 and audit[0]["needed"] is True
        assert audit[0]["external_comms"] == ["helper"] and audit[0]["sensitive_data"] == ["crm"]

        tagged = await _agentd([*argv, "--a2a-peer-tags", "helper=untrusted_input"])
        assert tagged.returncode == 0, tagged.stderr.decode()[-3000:]
