"""Tracing inside one process: the self-MCP server continues the trace a client sends in ``_meta``, and
``--log-content`` is what puts arguments on spans. Tracing is process-wide, so each test turns it off again."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from agentd import telemetry
from agentd.client import open_mcp_pool
from agentd.config import Config, McpServerConfig
from agentd.config.load import load_config
from agentd.config.model import IntelligenceConfig
from agentd.daemon import main
from agentd.oversight.drain import DrainLatch, use_drain
from agentd.run import run_config
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog, null_log
from agentd.telemetry.settings import OtelSettings
from tests.client.fakeserver import serve_fake
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.telemetry.otlp import otlp_receiver
from tests.telemetry.test_traces import _mcp
from tests.waiting import until


@pytest.fixture(autouse=True)
def tracing_off_afterwards():
    telemetry.disable()
    metrics.disable()
    yield
    telemetry.disable()
    metrics.disable()


async def test_the_self_mcp_server_continues_the_clients_trace():
    async with otlp_receiver() as receiver, trio.open_nursery() as nursery:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        cfg = load_config(["--intelligence", "test", "--serve-mcp", "http://127.0.0.1:0/mcp", "--otel"],
                               env=env)
        events: list[dict[str, Any]] = []
        latch = DrainLatch()
        done = trio.Event()

        async def daemon() -> None:
            with use_drain(latch):
                await main(cfg, log=EventLog(sink=events.append), env=env)
            done.set()

        nursery.start_soon(daemon)
        await until(lambda: any(e["event"] == "serve.start" for e in events), timeout=20, what="serve.start")
        url = next(e for e in events if e["event"] == "serve.start")["urls"][0]  # the endpoint, path included
        with telemetry.span("harness") as harness:
            async with open_mcp_pool([McpServerConfig("self", url)], log=null_log()) as pool:
                assert pool.tools()
        latch.request("test")
        with trio.fail_after(20):
            await done.wait()
        await telemetry.flush(5)
    trace_id = format(harness.get_span_context().trace_id, "032x")  # type: ignore[attr-defined]
    by_id = receiver.by_id()
    served = [s for s in receiver.spans if s.kind == 2]  # SPAN_KIND_SERVER
    assert "tools/list" in {s.name for s in served}
    orphans = [s.name for s in served if s.parent_span_id not in by_id]
    assert orphans == []
    for span in served:
        client = by_id[span.parent_span_id]
        assert (client.kind, client.name, client.trace_id) == (3, span.name, trace_id)
        assert span.attributes["mcp.method.name"] == span.name
        assert span.attributes["jsonrpc.request.id"]


@pytest.mark.parametrize("log_content", [False, True])
async def test_arguments_reach_a_span_only_with_log_content(log_content: bool):
    async with otlp_receiver() as receiver, trio.open_nursery() as nursery, \
            scripted_gateway([tool_call("fix__echo", {"text": "ARG-7f3e"}), text("done")]) as gw:
        mcp = await nursery.start(serve_fake, _mcp)
        telemetry.enable(OtelSettings(traces_endpoint=receiver.url + "/v1/traces", log_content=log_content))
        cfg = Config(instruction="INSTRUCTION-5d1c", intelligence=IntelligenceConfig(endpoints=(gw.url,)), mcp=(McpServerConfig("fix", mcp.url),))
        result = await run_config(cfg, run_id="r", log=null_log())
        assert result.status.value == "completed"
        await telemetry.flush(5)
        mcp.stop()
    [tool] = receiver.named("execute_tool echo")
    [agent] = receiver.named("invoke_agent")
    if log_content:
        assert "ARG-7f3e" in tool.attributes["gen_ai.tool.call.arguments"]
        assert agent.attributes["gen_ai.input.messages"] == "INSTRUCTION-5d1c"
    else:
        assert not any(b"ARG-7f3e" in body or b"INSTRUCTION-5d1c" in body for body in receiver.bodies)


async def test_a_batch_whose_export_is_cut_off_goes_out_with_the_next_flush(monkeypatch: pytest.MonkeyPatch):
    """The exporter pops a batch, then posts it: a post cut off (the run ending under the periodic exporter, a
    flush out of time) puts the batch back first in line for the final flush instead of losing it."""
    from tests.telemetry.otlp import Receiver

    answer = Receiver.__call__
    exports: list[int] = []

    async def first_export_hangs(self: Receiver, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/traces":
            exports.append(1)
            if len(exports) == 1:
                await trio.sleep_forever()
        await answer(self, scope, receive, send)

    monkeypatch.setattr(Receiver, "__call__", first_export_hangs)
    async with otlp_receiver() as receiver, scripted_gateway([text("done")]) as gw:
        telemetry.enable(OtelSettings(traces_endpoint=receiver.url + "/v1/traces"))
        result = await run_config(Config(instruction="hi", intelligence=IntelligenceConfig(endpoints=(gw.url,))), run_id="r", log=null_log())
        assert result.status.value == "completed"
        await telemetry.flush(0.5)  # the receiver holds this export: the flush gives up
        assert exports == [1] and receiver.spans == []
        await telemetry.flush(5)
    assert len(exports) == 2
    assert {"invoke_agent", "chat"} <= {s.name.split()[0] for s in receiver.spans}
