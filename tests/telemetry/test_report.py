"""``--report-file`` after a real run tree (root → child → grandchild, separate processes) and
``agentd report FILE`` rendering it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import trio

from agentd.cli import main as cli_main
from tests.client.fakeserver import serve_fake
from tests.peers.gateway import scripted_gateway
from tests.telemetry.test_traces import ROOT, SECRET, _decide, _mcp


async def test_the_report_holds_every_node_server_counts_and_the_ledger(tmp_path: Path, capsys):
    report = tmp_path / "report.jsonl"
    async with scripted_gateway(default=_decide) as gw, trio.open_nursery() as n:
        mcp = await n.start(serve_fake, _mcp)
        argv = [sys.executable, "-m", "agentd", "--instruction", "root: delegate", "--intelligence", gw.url,
                "--intelligence-token", "{{secret:GW_TOKEN}}", "--mcp", f"fix={mcp.url}",
                "--report-file", str(report)]
        with trio.fail_after(90):
            done = await trio.run_process(argv, cwd=ROOT, env={**os.environ, "GW_TOKEN": SECRET},
                                          capture_stdout=True, capture_stderr=True, check=False)
        mcp.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    lines = report.read_text().splitlines()
    assert len(lines) == 1  # one run tree
    doc = json.loads(lines[0])
    root = doc["tree"]
    assert (root["handle"], root["status"]) == ("0", "completed")
    [child] = root["children"]
    [grandchild] = child["children"]
    assert (child["handle"], grandchild["handle"]) == ("0.1", "0.1.1")
    assert all(node["status"] == "completed" and node["steps"] == 2 and node["duration_s"] >= 0
               for node in (root, child, grandchild))
    assert grandchild["children"] == []
    assert doc["nodes"] == 3
    assert doc["servers"]["fix"] == {"calls": 1, "errors": 0, "faults": 0, "rejected": 0}
    assert doc["servers"]["agentd"]["calls"] == 2  # the two subagent spawns
    total = sum(node["tokens"]["total"] for node in (root, child, grandchild))
    assert doc["budget"]["tokens_used"] == total and doc["budget"]["token_ceiling"] == 2_000_000
    assert SECRET not in report.read_text()

    from tests.terminal.pty_run import run_in_pty

    code, table, _ = run_in_pty(["report", str(report)], stdout_tty=True)  # at a terminal: for a person
    assert code == 0 and "0.1.1" in table and "completed" in table and "fix" in table
    assert "token_ceiling=2000000" in table and '"trees"' not in table
    capsys.readouterr()
    assert cli_main(["report", str(report)], env={}) == 0  # through a pipe: the JSON
    assert json.loads(capsys.readouterr().out)["trees"][0]["tree"]["handle"] == "0"
    code, forced, _ = run_in_pty(["report", str(report), "--json"], stdout_tty=True)
    assert code == 0 and json.loads(forced.strip().splitlines()[-1])["trees"][0]["tree"]["handle"] == "0"


def test_report_of_a_missing_file_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert cli_main(["report", str(tmp_path / "nope.jsonl")], env={}) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "nope.jsonl" in err
