"""The Rule of Two: refused at start (exit 2), audited when allowed, re-checked at every spawn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from agentd.config.load import load_config
from agentd.errors import ConfigError
from agentd.security.rule_of_two import check_trifecta
from agentd.supervisor.caps import Admission, Caps, Refusal, TreeLedger
from agentd.supervisor.supervisor import SupervisorSettings, open_supervisor
from agentd.supervisor.tools import reply
from agentd.supervisor.wiring import config_from_wire, config_to_wire
from agentd.telemetry.events import EventLog
from tests.supervisor.conftest import ROOT, req

REPO = Path(__file__).resolve().parents[2]
TAGS = {"inbox": None, "crm": ("sensitive_data",), "mail": ("external_comms",)}


def test_the_verdict_names_the_servers_that_bring_each_property():
    verdict = check_trifecta(TAGS)
    assert verdict.complete
    assert dict(verdict.sources) == {"untrusted_input": ("inbox",), "sensitive_data": ("crm",),
                                     "external_comms": ("mail",)}
    assert verdict.describe() == "untrusted_input: inbox; sensitive_data: crm; external_comms: mail"
    assert not check_trifecta({"crm": TAGS["crm"], "mail": TAGS["mail"]}).complete
    # An explicitly empty tag list brings nothing; untagged brings untrusted_input.
    assert not check_trifecta({**TAGS, "inbox": ()}).complete
    assert check_trifecta({"all": ("untrusted_input", "sensitive_data", "external_comms")}).complete


def _argv(*extra: str) -> list[str]:
    return ["--instruction", "x", "--intelligence", "test",
            "--mcp", "inbox=http://127.0.0.1:1/mcp", "--mcp", "crm=http://127.0.0.1:2/mcp",
            "--mcp", "mail=http://127.0.0.1:3/mcp",
            "--mcp-tags", "crm=sensitive_data", "--mcp-tags", "mail=external_comms,untrusted_input", *extra]


def test_a_trifecta_run_is_a_config_error_naming_the_servers():
    with pytest.raises(ConfigError, match=r"Rule of Two; untrusted_input: inbox, mail; sensitive_data: crm; "
                                          r"external_comms: mail\).*--allow-trifecta"):
        load_config(_argv(), {})
    config = load_config(_argv("--allow-trifecta"), {})
    assert config.allow_trifecta and config.server("crm").tags == ("sensitive_data",)
    assert config.server("inbox").tags is None


def test_tags_from_the_config_file_and_flag_errors(tmp_path):
    path = tmp_path / "agentd.yaml"
    path.write_text("mcp_servers:\n"
                    "  - {name: crm, url: 'http://127.0.0.1:2/mcp', tags: [sensitive_data]}\n"
                    "  - {name: mail, url: 'http://127.0.0.1:3/mcp', tags: [external_comms]}\n"
                    "  - {name: inbox, url: 'http://127.0.0.1:1/mcp'}\n")
    base = ["--config", str(path), "--instruction", "x", "--intelligence", "test"]
    with pytest.raises(ConfigError, match="Rule of Two"):
        load_config(base, {})
    # The flag replaces the file's tags: marking the inbox as bringing nothing makes the run safe.
    assert load_config([*base, "--mcp-tags", "inbox="], {}).server("inbox").tags == ()
    with pytest.raises(ConfigError, match="unknown tag 'secret'"):
        load_config([*base, "--mcp-tags", "crm=secret"], {})
    with pytest.raises(ConfigError, match="--mcp-tags nope: no such MCP server"):
        load_config([*base, "--mcp-tags", "nope=external_comms"], {})


def _agentd(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "AGENT_"))}
    return subprocess.run([sys.executable, "-m", "agentd", *argv], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=env)


def test_cli_refuses_with_exit_2_and_audits_an_allowed_trifecta():
    refused = _agentd(*_argv())
    assert refused.returncode == 2, refused.stderr
    assert "Rule of Two" in refused.stdout + refused.stderr and "inbox" in refused.stdout + refused.stderr
    allowed = _agentd(*_argv("--allow-trifecta", "--deadline", "5s"))
    assert allowed.returncode != 2, allowed.stderr  # the servers are not there: the run itself then fails
    events = [json.loads(line) for line in allowed.stderr.splitlines() if line.startswith("{")]
    audit = [e for e in events if e["event"] == "security.trifecta_allowed"]
    assert len(audit) == 1 and audit[0]["needed"] is True
    assert audit[0]["sensitive_data"] == ["crm"] and audit[0]["external_comms"] == ["mail"]


def test_allow_trifecta_is_never_inherited_by_a_child_config():
    config = load_config(_argv("--allow-trifecta"), {})
    child = config_from_wire(config_to_wire(config))
    assert child.allow_trifecta is False
    assert child.server("crm").tags == ("sensitive_data",) and child.server("inbox").tags is None


def test_the_spawn_chokepoint_checks_the_childs_narrowed_scope():
    ledger = TreeLedger(Caps(), root_scope=frozenset(TAGS), server_tags=TAGS)
    refused = ledger.admit("0", None, 0.0)  # the root's whole scope: refused even if the root was allowed
    assert isinstance(refused, Refusal) and not refused.retryable
    assert "Rule of Two; untrusted_input: inbox; sensitive_data: crm; external_comms: mail" in refused.message
    safe = ledger.admit("0", ["inbox", "mail"], 0.0)  # no sensitive data in this child's scope
    assert isinstance(safe, Admission) and safe.scope == frozenset({"inbox", "mail"})
    assert isinstance(ledger.admit("0", ["crm", "mail"], 0.0), Admission)


async def test_a_refused_spawn_is_an_iserror_result_and_starts_no_child():
    events: list[dict[str, object]] = []
    settings = SupervisorSettings(caps=Caps())
    with trio.fail_after(20):
        async with open_supervisor(servers=frozenset(TAGS), server_tags=TAGS, settings=settings,
                                   log=EventLog(sink=events.append, level="debug")) as sup:
            outcome = await sup.spawn(ROOT, req(["echo"]))
            assert sup.live() == []
    assert isinstance(outcome, Refusal)
    result = reply(outcome)
    assert result.is_error and "Rule of Two" in result.content[0]["text"]
    assert [e["event"] for e in events if str(e["event"]).startswith("subagent.")] == ["subagent.refused"]
