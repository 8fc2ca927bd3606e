"""The worker of the design document's composition example, through the real command line:
``--mode reactive --subscribe file:///nowhere --serve-mcp ... --serve-bearer ...`` with no ``--mcp``.

Its subscription has no owner (no server is declared), which must not stop a worker whose job is to serve:
it warns ``reactive.unowned`` once and keeps serving, then drains to exit 0. With nothing to serve either it
is a configuration error (exit 2), as are a URI template and a literal bearer (whose refusal says exactly
what to type).
"""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from tests.integration.agents import agentd_worker, run_agentd

pytestmark = pytest.mark.usefixtures("no_leftover_children")

TOKEN = "reviewer-token-0123456789"
ENV = {"REVIEWER_TOKEN": TOKEN}
WORKER = ["--instruction", "Be a reusable code-review worker", "--intelligence", "test",
          "--mode", "reactive", "--subscribe", "file:///nowhere"]


async def test_the_spec_worker_warns_once_about_its_unowned_subscription_and_serves() -> None:
    argv = [*WORKER, "--serve-mcp", "http://127.0.0.1:0", "--serve-bearer", "{{secret:REVIEWER_TOKEN}}",
            "--drain-timeout", "3"]
    async with agentd_worker(argv, env=ENV) as worker:
        with trio.fail_after(30):
            await worker.wait_event(lambda e: e.get("event") == "reactive.unowned")
            async with httpx.AsyncClient(timeout=10) as client:
                answer = await client.post(
                    f"http://127.0.0.1:{worker.port}/mcp",
                    headers={"authorization": f"Bearer {TOKEN}", "accept": "application/json, text/event-stream",
                             "content-type": "application/json"},
                    json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                        "protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"}}})
            assert answer.status_code == 200 and answer.json()["result"]["serverInfo"]["name"] == "agentd"
        worker.drain()
    assert worker.returncode == 0, worker.events[-5:]
    unowned = worker.named("reactive.unowned")
    assert len(unowned) == 1 and unowned[0]["uris"] == ["file:///nowhere"] and unowned[0]["level"] == "warn"
    result = json.loads(worker.stdout)  # one JSON document
    assert result["status"] == "completed", result
    assert TOKEN not in json.dumps(worker.events)


async def test_an_unowned_subscription_with_nothing_to_serve_is_exit_2() -> None:
    done = await run_agentd(WORKER, env=ENV)
    assert done.returncode == 2
    assert "no MCP server is declared to own it" in done.stderr.decode()


async def test_a_uri_template_is_not_subscribable_exit_2() -> None:
    done = await run_agentd(["--instruction", "x", "--intelligence", "test", "--mode", "reactive",
                             "--mcp", "notes=http://127.0.0.1:9/mcp", "--subscribe", "notes:file:///notes/{id}"])
    assert done.returncode == 2
    assert "a URI template is not subscribable" in done.stderr.decode()


async def test_a_literal_bearer_is_refused_with_exactly_what_to_type() -> None:
    done = await run_agentd([*WORKER, "--serve-mcp", "http://127.0.0.1:0", "--serve-bearer", TOKEN], env=ENV)
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "--serve-bearer '{{secret:REVIEWER_TOKEN}}'" in err, err
    assert TOKEN not in err and TOKEN not in done.stdout.decode()
