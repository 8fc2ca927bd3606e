"""Sampling with tools (2025-11-25): a server's ``sampling/createMessage`` that carries its own ``tools``, against a
real MCP server (the SDK peer tests/peers/servers/sampling_server.py: npm server-everything has no such tool) and
agentd's scripted gateway as the model.

Opted in with ``--mcp-capabilities NAME=sampling.tools``, agentd offers the gateway the server's tools and nothing
else (not agentd's own, not the other servers'), returns the model's call as ``tool_use`` content with
``stopReason: toolUse``, and sends the server's ``tool_result`` back to the model on its next request;
``toolChoice: none`` offers none. Opted in to ``sampling`` only, the handshake does not declare ``tools``: the
server's SDK does not send them, and no tool ever reaches the gateway from a sampling request."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from agentd.agent.asks import ServerAsks
from agentd.intelligence import open_intelligence
from agentd.intelligence.wire import Usage
from agentd.oversight.approvals import Refused
from agentd.telemetry.events import EventLog
from tests.ctl.daemon import daemon
from tests.peers import launch
from tests.peers.gateway import RecordedRequest, ScriptedGateway, scripted_gateway, text, tool_call

pytestmark = pytest.mark.interop


def chats(gw: ScriptedGateway) -> list[RecordedRequest]:
    return [r for r in gw.requests if r.path.endswith("/chat/completions")]


def _model(request: RecordedRequest) -> dict[str, Any]:
    """The run's own model calls samp__forecast twice (auto, then none); the sampling requests answer by what they
    offer: with get_weather, ask for it once, then answer from its result."""
    last = request.last_message
    if "samp__forecast" in request.tool_names:  # the run's own request
        told = [m for m in request.messages if m.get("role") == "tool"]
        if not told:
            return tool_call("samp__forecast", {"city": "Oslo"})
        if len(told) == 1:
            return tool_call("samp__forecast", {"city": "Bergen", "choice": "none"})
        return text("relayed")
    if request.tool_names == ["get_weather"] and last.get("role") != "tool":
        return tool_call("get_weather", {"city": "Oslo"}, usage={"prompt_tokens": 30, "completion_tokens": 6})
    if last.get("role") == "tool":
        return text(f"wear sunglasses ({last.get('content')})", usage={"prompt_tokens": 40, "completion_tokens": 5})
    return text("bring a coat", usage={"prompt_tokens": 20, "completion_tokens": 4})


def _tool_results(gw: ScriptedGateway) -> list[dict[str, Any]]:
    last = [r for r in chats(gw) if "samp__forecast" in r.tool_names][-1]
    return [json.loads(str(m["content"]).split("\n", 1)[-1]) if str(m["content"]).lstrip().startswith("{")
            else {"raw": m["content"]} for m in last.messages if m.get("role") == "tool"]


async def test_opted_in_the_servers_tools_reach_the_model_and_its_call_comes_back_as_tool_use(tmp_path):
    async with launch.peer_server(launch.sampling_server_argv()) as peer, scripted_gateway(default=_model) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"samp={peer.url}", "--mcp-capabilities", "samp=sampling.tools",
                "--instruction", "What to wear?", "--deadline", "120s"]
        async with daemon(argv, tmp_path) as d:
            code, result = await d.wait()
        assert code == 0 and result["result"] == "relayed", d.stderr.read_text()[-3000:]
        sampled = [r for r in chats(gw) if "samp__forecast" not in r.tool_names]
        assert [r.tool_names for r in sampled] == [["get_weather"], ["get_weather"], []]  # none: nothing offered
        first, second, plain = sampled
        assert [m["role"] for m in first.messages] == ["system", "user"]
        assert [m["role"] for m in second.messages] == ["user", "assistant", "tool"]  # no system prompt this time
        call = second.messages[1]["tool_calls"][0]
        assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
        assert second.messages[2]["tool_call_id"] == call["id"] and "sunny, 21 C in Oslo" in second.messages[2]["content"]
        assert plain.messages[-1]["content"] == "What should I wear in Bergen today?"
        auto, none = _tool_results(gw)
        assert auto["first"]["stopReason"] == "toolUse", auto
        [use] = [b for b in auto["first"]["content"] if b["type"] == "tool_use"]
        assert use == {"type": "tool_use", "id": call["id"], "name": "get_weather", "input": {"city": "Oslo"}}
        assert auto["second"]["content"]["text"].startswith("wear sunglasses") and "second" not in none
        assert none["first"]["content"] == {"type": "text", "text": "bring a coat"}
        usage = result["usage"]  # the three sampling replies count in the run's usage
        assert usage["prompt_tokens"] >= 30 + 40 + 20 and usage["completion_tokens"] >= 6 + 5 + 4
        assert [e["tool_uses"] for e in d.events("sampling.request")] == [1, 0, 0]


async def test_without_sampling_tools_no_tool_reaches_the_model_from_a_sampling_request(tmp_path):
    async with launch.peer_server(launch.sampling_server_argv()) as peer, scripted_gateway(default=_model) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"samp={peer.url}", "--mcp-capabilities", "samp=sampling",
                "--instruction", "What to wear?", "--deadline", "120s"]
        async with daemon(argv, tmp_path) as d:
            code, _ = await d.wait()
        assert code == 0
        assert all("get_weather" not in r.tool_names for r in chats(gw))  # the server never got to offer it
        assert d.events("sampling.request") == []


async def test_tools_from_a_server_not_opted_in_to_them_are_refused_before_any_model_call():
    async with scripted_gateway(default=text("never")) as gw:
        log = EventLog(sink=lambda line: None)
        async with open_intelligence(gw.url, log=log) as intel:
            counted: list[Usage] = []

            async def count(usage: Usage) -> None:
                counted.append(usage)

            asks = ServerAsks("r-1", log, intel, count, lambda: False, sampling_tools=False)
            params = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 10,
                      "tools": [{"name": "get_weather", "inputSchema": {"type": "object"}}]}
            with pytest.raises(Refused) as refused:
                await asks("samp", "sampling/createMessage", params)
            assert refused.value.code == -32602 and "sampling.tools" in refused.value.message
            with trio.fail_after(30):
                answer = await asks("samp", "sampling/createMessage", {**params, "tools": None})
        assert answer["content"] == {"type": "text", "text": "never"} and counted
        assert [r.tool_names for r in chats(gw)] == [[]]
