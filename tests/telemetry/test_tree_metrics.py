"""A subagent tree's metrics at the root: children are separate processes, and their counts still show up in
the root's ``/metrics`` (scraped and parsed with prometheus_client's parser) and in its OTLP metrics.

The root runs in this trio process (``--serve-mcp`` keeps it up after the run so it can be scraped); its
child and grandchild are real processes started by the real supervisor. Each level takes two model steps
of 10+5 tokens: the root and the child each spawn one subagent, the grandchild calls the MCP tool.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from agentd import telemetry
from agentd.config.load import load_config
from agentd.daemon import main
from agentd.oversight.drain import DrainLatch, use_drain
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from tests.client.fakeserver import serve_fake
from tests.peers.gateway import scripted_gateway
from tests.telemetry.otlp import otlp_receiver
from tests.telemetry.test_traces import _decide, _mcp
from tests.waiting import until


@pytest.fixture(autouse=True)
def telemetry_off_afterwards():
    telemetry.disable()
    metrics.disable()
    yield
    telemetry.disable()
    metrics.disable()


def _samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def _scrape_after_a_tree(*extra: str) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], Any]:
    """Run the tree with the root in this process; its /metrics scraped after the root's run, and the receiver."""
    events: list[dict[str, Any]] = []
    async with otlp_receiver() as receiver, scripted_gateway(default=_decide) as gw, trio.open_nursery() as nursery:
        mcp = await nursery.start(serve_fake, _mcp)
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
        cfg = load_config(["--instruction", "delegate", "--intelligence", gw.url, "--mcp", f"fix={mcp.url}",
                                "--serve-mcp", "http://127.0.0.1:0/mcp", "--metrics-addr", "127.0.0.1:0", "--otel",
                                *extra], env=env)
        latch = DrainLatch()
        ended = trio.Event()

        async def daemon() -> None:
            with use_drain(latch):
                await main(cfg, log=EventLog(sink=events.append), env=env)
            ended.set()

        nursery.start_soon(daemon)
        await until(lambda: any(e["event"] == "run.end" and e["agent_path"] == "0" for e in events), timeout=90,
                    what="the root's run.end")
        url = next(e for e in events if e["event"] == "serve.start" and e["comp"] == "metrics")["urls"][0]
        async with httpx.AsyncClient() as client:
            scraped = await client.get(url)
        latch.request("test")
        with trio.fail_after(30):
            await ended.wait()
        mcp.stop()
    assert scraped.status_code == 200
    return _samples(scraped.text), receiver


async def test_a_two_level_trees_counts_reach_the_roots_metrics():
    samples, receiver = await _scrape_after_a_tree()
    for depth in ("0", "1", "2"):
        assert samples[("agentd_runs_total", (("depth", depth), ("status", "completed")))] == 1, depth
        assert samples[("agentd_steps_total", (("depth", depth),))] == 2, depth
        assert samples[("agentd_tokens_total", (("depth", depth), ("kind", "input")))] == 20, depth
        assert samples[("agentd_tokens_total", (("depth", depth), ("kind", "output")))] == 10, depth
    for depth in ("0", "1"):  # the spawns
        assert samples[("agentd_tool_calls_total", (("depth", depth), ("outcome", "result"), ("server", "agentd")))] == 1
    assert samples[("agentd_tool_calls_total", (("depth", "2"), ("outcome", "result"), ("server", "fix")))] == 1
    # the grandchild's MCP request is in the root's histogram; the tree's six model calls in the gateway's
    call = (("error_type", ""), ("mcp_method_name", "tools/call"), ("server", "fix"))
    assert samples[("mcp_client_operation_duration_seconds_count", call)] == 1
    assert samples[("agentd_gateway_request_duration_seconds_count", (("outcome", "ok"),))] == 6
    # both subagents ended before the root's run did
    assert all(value == 0 for (name, _), value in samples.items() if name == "agentd_subagents_live")
    depths = {labels for (name, labels) in samples if name == "agentd_steps_total"}
    assert depths == {(("depth", "0"),), (("depth", "1"),), (("depth", "2"),)}  # bounded: depth, no handles
    # the same counts in the OTLP export (its final flush at exit), which only the root sends (no double counts)
    assert {p.resource["process.pid"] for export in receiver.metric_exports for p in export} == {os.getpid()}
    points = receiver.metric_exports[-1]
    steps = {p.attributes["agentd.agent.depth"]: p.value for p in points if p.name == "agentd.steps"}
    assert steps == {"0": 2, "1": 2, "2": 2}
    tokens = {(p.attributes["agentd.agent.depth"], p.attributes["gen_ai.token.type"]): (p.count, p.value)
              for p in points if p.name == "gen_ai.client.token.usage"}
    assert tokens == {(d, kind): (2, total) for d in ("0", "1", "2") for kind, total in (("input", 20),
                                                                                          ("output", 10))}


async def test_a_nested_childs_refused_spawn_is_counted_at_the_root():
    samples, _ = await _scrape_after_a_tree("--max-depth", "2")  # the child may not spawn the grandchild
    assert samples[("agentd_spawn_refusals_total", (("cap", "max_depth"),))] == 1
    for depth in ("0", "1"):
        assert samples[("agentd_steps_total", (("depth", depth),))] == 2, depth
    assert ("agentd_steps_total", (("depth", "2"),)) not in samples


def test_a_childs_malformed_observations_are_skipped_and_its_labels_stay_bounded():
    registry = metrics.enable()
    servers = [["tool", f"server-{i}", "result"] for i in range(3 * metrics.MAX_OPEN_VALUES)]
    garbage: list[Any] = ["nope", [], [3], ["step", -1, 2], ["step", "x", 1], ["step", True, 1], ["run"],
                          ["mcp", "tools/call", "fix", -1.0, ""], ["mcp", "tools/call", "fix", float("inf"), ""],
                          ["gateway", "slow", "ok"], ["gateway", float("nan"), "ok"], ["step", 2 ** 64, 1], ["failover", 1],
                          ["tool", "fix"], ["unknown", 1]]
    taken = metrics.merge(1, [["step", 7, 3], ["run", "no-such-status"], ["tool", "fix", "weird"],
                              ["mcp", "made/up", "fix", 0.5, "E" * 500], *garbage, *servers])
    assert taken == 4 + len(servers)
    assert metrics.merge(0, [["step", 1, 1]]) == 0 and metrics.merge(65, [["step", 1, 1]]) == 0  # not a child's depth
    samples = _samples(registry.exposition()[0].decode())
    assert samples[("agentd_steps_total", (("depth", "1"),))] == 1
    assert samples[("agentd_tokens_total", (("depth", "1"), ("kind", "input")))] == 7
    assert samples[("agentd_runs_total", (("depth", "1"), ("status", "other")))] == 1
    assert samples[("agentd_tool_calls_total", (("depth", "1"), ("outcome", "other"), ("server", "fix")))] == 1
    errors = {dict(labels)["error_type"] for (name, labels) in samples
              if name == "mcp_client_operation_duration_seconds_count"}
    assert errors == {"E" * 64} and {dict(labels)["mcp_method_name"] for (name, labels) in samples
                                     if name == "mcp_client_operation_duration_seconds_count"} == {"other"}
    names = {dict(labels)["server"] for (name, labels) in samples if name == "agentd_tool_calls_total"}
    assert len(names) == metrics.MAX_OPEN_VALUES + 1 and "other" in names
