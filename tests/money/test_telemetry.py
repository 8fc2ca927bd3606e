"""Money in the tree's metrics: each level's replies priced by its own process, counted at the root by depth in
``/metrics`` (``agentd_cost_usd_total``) and in the OTLP export (``agentd.cost``); a child's malformed cost
observation is skipped; the ``chat`` and ``invoke_agent`` spans carry ``agentd.cost_usd``."""

from __future__ import annotations

from typing import Any

import pytest

from agentd import telemetry
from agentd.config import Config
from agentd.config.model import IntelligenceConfig
from agentd.prices import Price
from agentd.run import run_config
from agentd.telemetry import metrics
from agentd.telemetry.events import null_log
from agentd.telemetry.settings import OtelSettings
from tests.peers.gateway import scripted_gateway, text
from tests.telemetry.otlp import otlp_receiver
from tests.telemetry.test_tree_metrics import _samples, _scrape_after_a_tree


@pytest.fixture(autouse=True)
def telemetry_off_afterwards() -> Any:
    telemetry.disable()
    metrics.disable()
    yield
    telemetry.disable()
    metrics.disable()


async def test_a_priced_trees_cost_reaches_the_roots_metrics_by_depth() -> None:
    samples, receiver = await _scrape_after_a_tree("--price", "default=1/2")
    # each level: 20 input tokens x $1/M + 10 output tokens x $2/M = $0.00004
    for depth in ("0", "1", "2"):
        assert samples[("agentd_cost_usd_total", (("depth", depth),))] == pytest.approx(4e-05), depth
    points = receiver.metric_exports[-1]
    cost = {p.attributes["agentd.agent.depth"]: p.value for p in points if p.name == "agentd.cost"}
    assert cost == pytest.approx({"0": 4e-05, "1": 4e-05, "2": 4e-05})


def test_a_childs_cost_observations_are_checked() -> None:
    registry = metrics.enable()
    taken = metrics.merge(1, [["cost", 0.5], ["cost", -1], ["cost", "x"], ["cost", True], ["cost", 1e9], ["cost"]])
    assert taken == 1
    samples = _samples(registry.exposition()[0].decode())
    assert samples[("agentd_cost_usd_total", (("depth", "1"),))] == 0.5


async def test_spans_carry_what_a_reply_and_a_run_cost() -> None:
    async with otlp_receiver() as receiver, scripted_gateway(
            [text("done", usage={"prompt_tokens": 1000, "completion_tokens": 100})]) as gw:
        telemetry.enable(OtelSettings(traces_endpoint=receiver.url + "/v1/traces"))
        cfg = Config(instruction="hi", intelligence=IntelligenceConfig(endpoints=(gw.url,), model="big", prices={"big": Price(3_000_000, 15_000_000)}), )
        result = await run_config(cfg, run_id="r", log=null_log())
        assert result.status.value == "completed" and result.usage.cost == 4_500_000_000
        await telemetry.flush(5)
    [chat] = [s for s in receiver.spans if s.name.startswith("chat")]
    [agent] = receiver.named("invoke_agent")
    assert chat.attributes["agentd.cost_usd"] == pytest.approx(0.0045)
    assert agent.attributes["agentd.cost_usd"] == pytest.approx(0.0045)
