"""A child that runs the real agent loop against the scripted gateway: the gateway decides what it does."""

from __future__ import annotations

import pytest
import trio

from agentd.config.model import Config, IntelligenceConfig, LadderConfig, from_flat
from agentd.supervisor.supervisor import Caller, Origin, SpawnRequest
from agentd.supervisor.wiring import open_root_supervisor
from agentd.telemetry.events import EventLog
from tests.peers.gateway import scripted_gateway, text, tool_call

ROOT = Caller(Origin.STDIO, "0")


def _config(url: str, **kw) -> Config:
    return from_flat(dict(instruction="root", intelligence=(url,), intelligence_token="{{secret:GW_TOKEN}}", **kw))


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "re-exec"])
async def test_a_real_child_runs_the_loop_and_reports_usage(events, no_leftover_children, fork_server):
    async with scripted_gateway([text('{"answer": 42}', usage={"prompt_tokens": 30, "completion_tokens": 12})]) as gw:
        cfg = _config(gw.url)
        with trio.fail_after(30):
            async with open_root_supervisor(cfg, log=EventLog(sink=events.append), env={"GW_TOKEN": "tok-abcdef"},
                                            fork_server=fork_server) as sup:
                view = await sup.spawn(ROOT, SpawnRequest("find the answer", output_contract="JSON {answer}"))
                used = sup.statistics().tokens_used
    assert (view.status, view.done) == ("completed", True), view
    assert view.result == {"answer": 42}
    assert used == 42
    request = gw.requests[0]
    assert request.headers.get("authorization") == "Bearer tok-abcdef"
    assert any("find the answer" in str(m.get("content")) for m in request.messages)


async def test_a_real_child_delegates_through_its_own_subagent_tools(events, no_leftover_children):
    def decide(request):
        last = request.messages[-1]
        said = str(last.get("content"))
        if last.get("role") == "tool":
            return text("parent saw: " + said[:200])
        if "grandchild task" in said:
            return text("grandchild done")
        names = [t["function"]["name"] for t in request.body.get("tools", [])]
        spawn = next(n for n in names if n.startswith("subagent") and n.endswith("spawn"))
        return tool_call(spawn, {"instruction": "grandchild task"})

    async with scripted_gateway([]) as gw:
        gw.push(*[decide] * 8)
        cfg = _config(gw.url)
        with trio.fail_after(40):
            async with open_root_supervisor(cfg, log=EventLog(sink=events.append), env={"GW_TOKEN": "tok-abcdef"}) as sup:
                view = await sup.spawn(ROOT, SpawnRequest("child task: delegate"))
    assert view.status == "completed", view
    assert "grandchild done" in str(view.result) and "0.1.1" in str(view.result)


async def test_the_drain_latch_stops_spawns_and_drains_the_root_supervisor(events, no_leftover_children):
    from agentd.oversight.drain import DrainLatch, use_drain
    from agentd.supervisor.caps import Refusal
    from tests.supervisor.conftest import _from_instruction, req

    cfg = Config(instruction="root", intelligence=IntelligenceConfig(endpoints=("http://127.0.0.1:9/v1",)), ladder=LadderConfig(drain_timeout=1.5, cancel_grace=2.0), )
    latch = DrainLatch()
    with use_drain(latch), trio.fail_after(40):
        async with open_root_supervisor(cfg, log=EventLog(sink=events.append), env={},
                                        test_script=_from_instruction) as sup:
            quick = await sup.spawn(ROOT, req(["sleep", 0.5], ["result", "finished in time"], async_=True))
            slow = await sup.spawn(ROOT, req(["hang"], async_=True))
            latch.request("SIGTERM")
            await sup.wait_until(lambda s: s.draining)
            refused = await sup.spawn(ROOT, req(["echo"]))
            assert isinstance(refused, Refusal) and "draining" in refused.message
            assert (await sup.await_(ROOT, quick.handle)).result == "finished in time"
            ended = await sup.await_(ROOT, slow.handle)
            assert (ended.status, ended.partial) == ("cancelled", True)
    assert events.named("subagent.drain")
    assert events.named("subagent.cancel", handle=slow.handle)[0]["reason"] == "draining"
