"""OTLP metrics (``--otel``): after a run with known counts, what the in-process OTLP/HTTP receiver decoded.

The run is the one ``test_metrics`` scrapes (three model steps of 10+5 tokens, one tool call answered
plainly and one with ``isError``), through a real daemon in this trio process; the metrics reach the
receiver by the final flush at exit. Metrics and tracing are process-wide, so each test turns them off.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio

from agentd import telemetry
from agentd.config.load import load_config
from agentd.daemon import main
from agentd.oversight.drain import DrainLatch, use_drain
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from agentd.telemetry.settings import OtelSettings
from tests.client.fakeserver import serve_fake
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.telemetry.otlp import ReceivedPoint, otlp_receiver
from tests.telemetry.test_metrics import _mcp
from tests.waiting import until

USAGE = {"prompt_tokens": 10, "completion_tokens": 5}
KEY = "k-METRICS-SECRET-77"


@pytest.fixture(autouse=True)
def telemetry_off_afterwards():
    telemetry.disable()
    metrics.disable()
    yield
    telemetry.disable()
    metrics.disable()


async def _run(extra_env: dict[str, str]) -> tuple[Any, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    async with otlp_receiver() as receiver, scripted_gateway(
        [tool_call("fix__ok", {}, usage=USAGE), tool_call("fix__bad", {}, usage=USAGE), text("done", usage=USAGE)]
    ) as gw, trio.open_nursery() as nursery:
        mcp = await nursery.start(serve_fake, _mcp)
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "agentd-metrics", **extra_env}
        cfg = load_config(["--instruction", "go", "--intelligence", gw.url, "--mcp", f"fix={mcp.url}",
                                "--otel"], env=env)
        with trio.fail_after(60):
            result = await main(cfg, log=EventLog(sink=events.append), env=env)
        mcp.stop()
    assert result.status.value == "completed"
    return receiver, events


def _one(points: list[ReceivedPoint], name: str, **attributes: Any) -> ReceivedPoint:
    found = [p for p in points if p.name == name and all(p.attributes.get(k) == v for k, v in attributes.items())]
    assert len(found) == 1, (name, attributes, found)
    return found[0]


async def test_otlp_metrics_carry_the_known_counts_with_convention_names_and_units():
    receiver, events = await _run({"OTEL_EXPORTER_OTLP_METRICS_HEADERS": f"x-api-key={KEY}"})
    assert receiver.metric_exports, "no metrics export reached the receiver"
    points = receiver.metric_exports[-1]  # cumulative: the final flush holds the totals
    assert {p.resource.get("service.name") for p in points} == {"agentd-metrics"}
    runs = _one(points, "agentd.runs", **{"agentd.run.status": "completed", "agentd.agent.depth": "0"})
    assert (runs.kind, runs.value, runs.unit) == ("sum", 1, "{run}")
    assert _one(points, "agentd.steps", **{"agentd.agent.depth": "0"}).value == 3
    for kind, total in (("input", 30), ("output", 15)):
        tokens = _one(points, "gen_ai.client.token.usage", **{"gen_ai.token.type": kind})
        assert (tokens.kind, tokens.unit, tokens.count, tokens.value) == ("histogram", "{token}", 3, total)
        assert tokens.attributes["gen_ai.operation.name"] == "chat"
        assert tokens.attributes["gen_ai.provider.name"] == "openai"
        assert tokens.bounds == metrics.TOKEN_BUCKETS
    for outcome in ("result", "tool_error"):
        calls = _one(points, "agentd.tool.calls", **{"agentd.mcp.server": "fix", "agentd.outcome": outcome})
        assert calls.value == 1
    calls = [p for p in points if p.name == "mcp.client.operation.duration"
             and p.attributes["mcp.method.name"] == "tools/call"]
    assert sorted((p.attributes.get("error.type", ""), p.count) for p in calls) == [("", 1), ("tool_error", 1)]
    assert all(p.unit == "s" and p.bounds == metrics.MCP_DURATION_BUCKETS for p in calls)
    chat = _one(points, "gen_ai.client.operation.duration")
    assert (chat.unit, chat.count, chat.bounds) == ("s", 3, metrics.GATEWAY_DURATION_BUCKETS)
    rss = _one(points, "process.memory.usage")
    assert rss.unit == "By" and rss.value > 0
    # the metrics credential went with the export, and nowhere else
    metric_headers = [h for h in receiver.headers if h.get("x-api-key")]
    assert metric_headers and all(h["x-api-key"] == KEY for h in metric_headers)
    assert not any(KEY in str(line) for line in events)


async def test_otel_metrics_exporter_none_leaves_metrics_out():
    receiver, _ = await _run({"OTEL_METRICS_EXPORTER": "none"})
    assert receiver.metric_exports == []
    assert receiver.spans  # tracing itself stays on
    assert not metrics.otel_enabled()


async def test_metrics_are_exported_periodically_while_the_daemon_runs():
    async with otlp_receiver() as receiver, trio.open_nursery() as nursery:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_METRIC_EXPORT_INTERVAL": "100"}
        cfg = load_config(["--intelligence", "test", "--serve-mcp", "http://127.0.0.1:0/mcp", "--otel"], env=env)
        latch = DrainLatch()
        done = trio.Event()

        async def daemon() -> None:
            with use_drain(latch):
                await main(cfg, log=EventLog(sink=lambda line: None), env=env)
            done.set()

        nursery.start_soon(daemon)
        # a served daemon has no run: its exports carry at least its memory
        await until(lambda: len(receiver.metric_exports) >= 3, timeout=30, what="three metric exports")
        latch.request("test")
        with trio.fail_after(30):
            await done.wait()
    assert all(any(p.name == "process.memory.usage" for p in export) for export in receiver.metric_exports)


async def test_the_final_flush_to_a_collector_that_never_answers_is_bounded(autojump_clock):
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, _black_hole, 0, host="127.0.0.1"))  # mute
        port = listeners[0].socket.getsockname()[1]
        settings = OtelSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                                          "OTEL_EXPORTER_OTLP_TIMEOUT": "600000"})
        otel = metrics.enable_otel(settings)
        metrics.step(10, 5)
        started = trio.current_time()
        await metrics.flush(5.0)
        assert 5.0 <= trio.current_time() - started < 6.0
        assert (otel.exported, otel.failed) == (0, 1)
        nursery.cancel_scope.cancel()


async def _black_hole(stream: trio.SocketStream) -> None:
    await trio.sleep_forever()


async def test_the_cluster_capacity_gauges_reach_the_collector_with_their_names_and_units():
    async with otlp_receiver() as receiver:
        metrics.enable_otel(OtelSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}))
        metrics.cluster_capacity(1, 3, 2, 7, 4.5)
        metrics.cluster_capacity(0, 3, 1, 8, None)  # the last read wins; an empty queue's age is 0
        with trio.fail_after(30):
            await metrics.flush(10)
    points = receiver.metric_exports[-1]
    got = {p.name: (p.value, p.unit) for p in points if p.name.startswith("agentd.cluster.")}
    assert got == {"agentd.cluster.member.free_slots": (0, "{slot}"), "agentd.cluster.members": (3, "{member}"),
                   "agentd.cluster.free_slots": (1, "{slot}"), "agentd.cluster.queue.depth": (8, "{item}"),
                   "agentd.cluster.queue.oldest_age": (0.0, "s")}
