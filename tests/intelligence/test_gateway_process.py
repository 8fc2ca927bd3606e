"""The scripted gateway as a separate program, the way end-to-end CLI tests use it."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from agentd.intelligence import ChatTool, open_intelligence
from agentd.telemetry.events import null_log
from tests.peers.gateway import gateway_argv, read_record
from tests.peers.launch import peer_server


async def test_gateway_program_replays_rules_and_records(tmp_path: Path) -> None:
    script = {
        "rules": [{"match": {"last_role": "tool"}, "reply": {"content": "saw the tool result"}}],
        "replies": [{"tool_calls": [{"name": "s__echo", "arguments": {"text": "x"}}]}],
        "default": {"status": 500},
    }
    (tmp_path / "script.json").write_text(json.dumps(script))
    record = tmp_path / "requests.jsonl"
    with trio.fail_after(30):
        async with peer_server(gateway_argv(tmp_path / "script.json", record)) as peer:
            assert peer.url.endswith("/v1")
            async with open_intelligence([peer.url], stream=True, log=null_log()) as intel:
                tools = [ChatTool("s__echo", "", {"type": "object"})]
                first = await intel.complete([{"role": "user", "content": "go"}], tools)
                assert first.tool_calls[0].name == "s__echo"
                history = [
                    {"role": "user", "content": "go"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "s__echo", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": "x"},
                ]
                second = await intel.complete(history, tools)
                assert second.content == "saw the tool result"
    requests = read_record(record)
    assert [r.path for r in requests] == ["/v1/chat/completions"] * 2
    assert requests[1].last_message["role"] == "tool"
    assert requests[0].stream and requests[0].tool_names == ["s__echo"]
