"""Money and models across a real tree: ``agentd`` processes (and their real children) against the scripted
gateway, which reports the usage each reply costs.

- the stdout ``usage`` carries ``cost_usd`` for the whole tree, each reply priced by the model that made it (a
  child on another model at that model's price), the root's own share under ``own``;
- a child's gateway requests carry the model its spawn chose, the parent's keep the parent's;
- ``--budget-usd`` stops the root at the reply that spends it (exit 7, ``exhausted_budget``), with no further
  model request;
- a spawn that names a model outside ``--models`` is an ``isError`` tool result, and no child process starts,
  whether the model asked for it (``subagent.spawn`` in the loop) or a peer did (the served ``subagent.spawn``);
- a money budget over an unpriced model is a config error (exit 2) before anything happens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.integration.agents import agentd_worker, events_of, run_agentd, text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

#: $3 / $15 per million tokens for the root's model, $0.25 / $1.25 for the child's.
PRICES = ["--price", "big=3/15", "--price", "small=0.25/1.25"]


def _doc(done: Any) -> dict[str, Any]:
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, (done.stdout, done.stderr.decode()[-3000:])
    return dict(json.loads(lines[0]))


def _model(request: RecordedRequest) -> str:
    return str(request.body.get("model"))


def _tree(request: RecordedRequest) -> dict[str, Any]:
    """The root (model ``big``) spawns one child on ``small``; the child answers; the root finishes."""
    if _model(request) == "small":
        return text("child answer", usage={"prompt_tokens": 1000, "completion_tokens": 200})
    if any(m.get("role") == "tool" for m in request.messages):
        return text("root answer", usage={"prompt_tokens": 2000, "completion_tokens": 100})
    return tool_call("subagent_spawn", {"instruction": "CHILD TASK: answer", "model": "small"},
                     usage={"prompt_tokens": 1000, "completion_tokens": 50})


async def test_cost_usd_is_the_trees_each_reply_at_its_own_models_price(tmp_path: Path, capsys: Any) -> None:
    report = tmp_path / "report.jsonl"
    async with scripted_gateway([], default=_tree) as gw:
        done = await run_agentd(["--instruction", "delegate", "--intelligence", gw.url, "--model", "big",
                                 "--models", "small", *PRICES, "--budget-usd", "1", "--report-file", str(report)])
        requests = list(gw.requests)
    doc = _doc(done)
    assert done.returncode == 0 and doc["status"] == "completed", (doc, done.stderr.decode()[-3000:])
    assert [_model(r) for r in requests] == ["big", "small", "big"]
    # root: 3000 prompt x $3/M + 150 completion x $15/M = $0.01125; child: 1000 x $0.25/M + 200 x $1.25/M = $0.0005
    assert doc["usage"]["own"]["cost_usd"] == 0.01125, doc
    assert doc["usage"]["cost_usd"] == 0.01175, doc
    assert doc["usage"]["total_tokens"] == 3150 + 1200, doc
    # the report: each node's own cost, the tree's in its budget
    [tree] = [json.loads(line) for line in report.read_text().splitlines()]
    assert tree["tree"]["cost_usd"] == 0.01125 and tree["tree"]["children"][0]["cost_usd"] == 0.0005, tree
    assert tree["budget"]["cost_usd"] == 0.01175 and tree["budget"]["budget_usd"] == 1, tree["budget"]
    from tests.terminal.pty_run import run_in_pty

    code, table, _ = run_in_pty(["report", str(report)], stdout_tty=True)
    assert code == 0 and "usd" in table and "0.011250" in table and "0.000500" in table, table


async def test_the_root_stops_at_the_reply_that_spends_the_money_budget() -> None:
    # $0.003 for the first reply, past a budget of $0.001: were it ignored, the tool call would run and a second
    # model request would follow.
    first = tool_call("resource_read", {"uri": "file:///none"}, usage={"prompt_tokens": 500, "completion_tokens": 100})
    async with scripted_gateway([first], default=text("should never be asked")) as gw:
        done = await run_agentd(["--instruction", "spend", "--intelligence", gw.url, "--model", "big", *PRICES,
                                 "--budget-usd", "0.001"])
        requests = len(gw.requests)
    doc = _doc(done)
    assert done.returncode == 7, (doc, done.stderr.decode()[-3000:])
    assert doc["status"] == "exhausted_budget" and doc["partial"] is True, doc
    assert requests == 1 and doc["steps"] == 1
    assert doc["usage"]["cost_usd"] == 0.003 and doc["usage"]["own"]["cost_usd"] == 0.003, doc
    budget = [e for e in events_of(done) if e.get("event") == "loop.budget"]
    assert budget and budget[0]["budget"] == "budget_usd" and budget[0]["cost_usd"] == 0.003, budget


async def test_a_model_outside_the_allow_list_is_refused_as_a_tool_error_and_starts_nothing() -> None:
    def reply(request: RecordedRequest) -> dict[str, Any]:
        if any(m.get("role") == "tool" for m in request.messages):
            return text("adapted")
        return tool_call("subagent_spawn", {"instruction": "CHILD TASK", "model": "huge"})

    async with scripted_gateway([], default=reply) as gw:
        done = await run_agentd(["--instruction", "delegate", "--intelligence", gw.url, "--model", "big",
                                 "--models", "small", *PRICES])
        requests = list(gw.requests)
    doc = _doc(done)
    assert done.returncode == 0 and doc["result"] == "adapted", (doc, done.stderr.decode()[-3000:])
    assert [_model(r) for r in requests] == ["big", "big"]
    observed = requests[1].messages[-1]
    assert observed["role"] == "tool" and "spawn refused: model 'huge' is not allowed" in observed["content"]
    assert "allowed: big, small" in observed["content"]
    events = events_of(done)
    assert not [e for e in events if e.get("event") in ("subagent.spawn", "subagent.ready")], events
    refused = [e for e in events if e.get("event") == "subagent.refused"]
    assert refused and refused[0]["cap"] == "model"
    # priced, though no money budget: the usage says what the run cost
    assert "cost_usd" in doc["usage"]


async def test_a_spawn_without_models_may_only_keep_its_parents_model() -> None:
    def reply(request: RecordedRequest) -> dict[str, Any]:
        if any(m.get("role") == "tool" for m in request.messages):
            return text("adapted")
        return tool_call("subagent_spawn", {"instruction": "CHILD TASK", "model": "small"})

    async with scripted_gateway([], default=reply) as gw:
        done = await run_agentd(["--instruction", "delegate", "--intelligence", gw.url, "--model", "big"])
        requests = list(gw.requests)
    doc = _doc(done)
    assert done.returncode == 0, (doc, done.stderr.decode()[-3000:])
    assert len(requests) == 2 and "spawn refused: model 'small'" in requests[1].messages[-1]["content"]
    assert "cost_usd" not in doc["usage"]  # not priced: no cost is claimed


async def test_a_money_budget_over_an_unpriced_model_exits_2_before_anything_happens(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with scripted_gateway([], default=text("never")) as gw:
        done = await run_agentd(["--instruction", "x", "--intelligence", gw.url, "--model", "big", "--models",
                                 "small,other", *PRICES, "--budget-usd", "2", "--state-dir", str(state)])
        requests = len(gw.requests)
    assert done.returncode == 2, done.stderr.decode()[-3000:]
    assert "--budget-usd: model 'other' has no price" in done.stderr.decode()
    assert requests == 0 and not state.exists()


async def test_a_served_spawn_chooses_its_model_from_the_allow_list() -> None:
    async with scripted_gateway([], default=text("served child done")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url, "--model", "big",
                "--models", "small", "--drain-timeout", "5"]
        async with agentd_worker(argv) as worker:
            server = McpServerConfig(name="worker", url=worker.url)
            with trio.fail_after(60):
                async with open_mcp_pool([server], log=EventLog(sink=lambda line: None),
                                         secrets=SecretResolver(env={}), run_id="t") as pool:
                    refused = await pool.call_tool("worker", "subagent.spawn", {"instruction": "X", "model": "huge"})
                    assert refused.is_error is True, refused
                    assert "spawn refused: model 'huge' is not allowed" in text_of(refused.content)
                    assert not worker.named("subagent.spawn") and gw.requests == []  # nothing started
                    ok = await pool.call_tool("worker", "subagent.spawn", {"instruction": "SERVED", "model": "small"})
                    assert ok.is_error is False and ok.structured["result"] == "served child done", ok
        assert [_model(r) for r in gw.requests] == ["small"]
