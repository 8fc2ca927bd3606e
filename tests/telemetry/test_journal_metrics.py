"""With ``--state-dir``: the journal's commit lag and queue in ``/metrics``, and the journal on ``/events``.

A real daemon in this trio process with a real SQLite journal runs three model steps (two with a tool call);
each step's batch is committed once, so the lag histogram counts three commits and the queue is empty after.
A ``/events`` subscriber that connects after the run first gets the ``journal.opened`` line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from agentd.config.load import load_config
from agentd.daemon import main
from agentd.oversight.drain import DrainLatch, use_drain
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from tests.client.fakeserver import serve_fake
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.telemetry.test_metrics import _mcp, _samples
from tests.waiting import until


@pytest.fixture(autouse=True)
def metrics_off_afterwards():
    metrics.disable()
    yield
    metrics.disable()


async def test_journal_lag_and_queue_in_metrics_and_the_journal_on_the_event_stream(tmp_path: Path):
    events: list[dict[str, Any]] = []
    async with scripted_gateway([tool_call("fix__ok", {}), tool_call("fix__bad", {}), text("done")]) as gw, \
            trio.open_nursery() as nursery:
        mcp = await nursery.start(serve_fake, _mcp)
        cfg = load_config(["--instruction", "go", "--intelligence", gw.url, "--mcp", f"fix={mcp.url}",
                                "--state-dir", str(tmp_path / "state"), "--serve-mcp", "http://127.0.0.1:0/mcp",
                                "--metrics-addr", "127.0.0.1:0"], env={})
        latch = DrainLatch()
        ended = trio.Event()

        async def daemon() -> None:
            with use_drain(latch):
                await main(cfg, log=EventLog(sink=events.append), env={})
            ended.set()

        nursery.start_soon(daemon)
        await until(lambda: any(e["event"] == "run.end" for e in events), timeout=30, what="run.end")
        starts = [e for e in events if e["event"] == "serve.start"]
        metrics_url = next(e for e in starts if e["comp"] == "metrics")["urls"][0]
        serve_url = next(e for e in starts if e["comp"] != "metrics")["urls"][0]
        async with httpx.AsyncClient() as client:
            samples = _samples((await client.get(metrics_url)).text)
        ws_url = serve_url.split("/mcp")[0].replace("http://", "ws://") + "/events"
        async with open_websocket_url(ws_url) as ws:
            with trio.fail_after(10):
                first = json.loads(await ws.get_message())
        latch.request("test")
        with trio.fail_after(30):
            await ended.wait()
        mcp.stop()
    assert samples[("agentd_journal_commit_lag_seconds_count", ())] == 3
    assert 0 <= samples[("agentd_journal_commit_lag_seconds_sum", ())] < 30
    assert samples[("agentd_journal_queue", ())] == 0
    assert first["event"] == "journal.opened" and first["path"].startswith(str(tmp_path))
