"""``approve`` and ``capabilities`` on a server: from the file and from ``--approve`` / ``--mcp-capabilities``,
merged, checked (exit 2 naming the flag or key), and refused where they mean nothing (A2A peers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentd.config.load import load_config
from tests.config.test_file import load, refused

SERVERS = """
mcp_servers:
  - name: pay
    url: https://pay.example/mcp
    approve: [refund]
    capabilities: [sampling, elicitation]
"""


def test_file_entries_and_flags_merge(tmp_path: Path) -> None:
    cfg = load(tmp_path, SERVERS, "--approve", "pay__charge", "--approve", "pay__refund",
               "--mcp", "fs=https://fs.example/mcp", "--approve", "fs__*", "--mcp-capabilities", "fs=elicitation")
    servers = {s.name: s for s in cfg.mcp}
    assert servers["pay"].approve == ("refund", "charge")
    assert servers["pay"].capabilities == ("elicitation", "sampling")  # one order, whatever the file's
    assert servers["fs"].approve == ("*",) and servers["fs"].capabilities == ("elicitation",)


def test_sampling_tools_implies_sampling_and_declares_it_as_a_sub_capability(tmp_path: Path) -> None:
    from agentd.mcp.client_session import ClientSession
    from agentd.mcp.types import Implementation

    cfg = load(tmp_path, SERVERS, "--mcp", "fs=https://fs.example/mcp", "--mcp-capabilities", "fs=sampling.tools")
    declared = {s.name: s for s in cfg.mcp}["fs"].capabilities
    assert declared == ("sampling", "sampling.tools")
    session = ClientSession(Implementation(name="agentd", version="1"), declared=declared)
    assert session.start_initialize().params["capabilities"] == {"sampling": {"tools": {}}}  # type: ignore[index]
    assert session.declares("sampling/createMessage") and not session.declares("elicitation/create")


def test_by_default_nothing_needs_approval_and_nothing_is_declared() -> None:
    cfg = load_config(["--instruction", "x", "--intelligence", "test", "--mcp", "a=https://a.example/mcp"],
                           env={})
    assert cfg.mcp[0].approve == () and cfg.mcp[0].capabilities == ()


@pytest.mark.parametrize(("extra", "fragment"), [
    (("--approve", "bank__pay"), "--approve bank: no such MCP server"),
    (("--approve", "pay"), "expected SERVER__TOOL"),
    (("--approve", "pay__"), "expected SERVER__TOOL"),
    (("--mcp-capabilities", "pay=roots"), "'roots' is not a client capability"),
    (("--mcp-capabilities", "nobody=sampling"), "--mcp-capabilities nobody: no such MCP server"),
])
def test_bad_flags_are_config_errors(tmp_path: Path, extra: tuple[str, ...], fragment: str) -> None:
    assert fragment in refused(tmp_path, SERVERS, *extra)


@pytest.mark.parametrize(("entry", "fragment"), [
    ("approve: ['']", "$.mcp_servers[0].approve: a tool name must be a non-empty string"),
    ("capabilities: [tools]", "$.mcp_servers[0].capabilities: 'tools' is not a client capability"),
])
def test_bad_entries_are_config_errors(tmp_path: Path, entry: str, fragment: str) -> None:
    text = f"mcp_servers:\n  - name: pay\n    url: https://pay.example/mcp\n    {entry}\n"
    assert fragment in refused(tmp_path, text)


def test_a2a_peers_take_neither(tmp_path: Path) -> None:
    text = "a2a_peers:\n  - name: p\n    url: https://p.example/\n    approve: [x]\n"
    assert "unknown key 'approve'" in refused(tmp_path, text)


def test_a_bad_flag_exits_2_before_anything_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "agentd", "--instruction", "x", "--intelligence", "test",
                           "--mcp", "a=https://a.example/mcp", "--approve", "b__x", "--state-dir",
                           str(tmp_path / "state")], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--approve b: no such MCP server" in done.stderr
    assert not (tmp_path / "state").exists()


def test_a_subagent_inherits_the_marks_and_the_opt_in() -> None:
    """A child's config travels as JSON: a marked tool stays marked there (and, with nobody to ask in a child's
    process, is denied rather than sent)."""
    from agentd.supervisor.wiring import config_from_wire, config_to_wire

    cfg = load_config(["--instruction", "x", "--intelligence", "test", "--mcp", "p=https://p.example/mcp",
                            "--approve", "p__charge", "--mcp-capabilities", "p=sampling"], env={})
    child = config_from_wire(config_to_wire(cfg))
    assert child.mcp[0].approve == ("charge",) and child.mcp[0].capabilities == ("sampling",)
