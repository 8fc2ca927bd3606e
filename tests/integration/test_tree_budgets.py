"""Budgets hold at the root, and usage is the whole tree's: real ``agentd`` processes (and their real children)
against the scripted gateway, which reports the usage each reply costs.

- ``--token-ceiling`` stops the root run like every child: the reply that crosses it ends the run (exit 7), no
  further model request is made, and its tokens are in the result;
- the stdout result's ``usage`` is the whole tree's (the root's own share under ``own``), nothing counted twice;
- the ``subagent.spawn`` result the parent's model reads carries the child subtree's ``usage``;
- a reply cut mid-stream (the deadline) is counted from what the gateway had streamed: its usage when the
  gateway sent it, else an estimate, marked ``estimated_tokens``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.agents import events_of, run_agentd
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]


def _doc(done: Any) -> dict[str, Any]:
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, (done.stdout, done.stderr.decode()[-3000:])
    return dict(json.loads(lines[0]))


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def test_the_root_stops_at_the_reply_that_crosses_the_token_ceiling() -> None:
    # Were the ceiling ignored, the tool call would run and a second model request would follow.
    first = {**tool_call("resource_read", {"uri": "file:///none"}),
             "usage": {"prompt_tokens": 500, "completion_tokens": 100}}
    async with scripted_gateway([first], default=text("should never be asked")) as gw:
        done = await run_agentd(["--instruction", "spend a lot", "--intelligence", gw.url,
                                 "--token-ceiling", "150"])
        requests = len(gw.requests)
    doc = _doc(done)
    assert done.returncode == 7, (doc, done.stderr.decode()[-3000:])
    assert doc["status"] == "exhausted_tokens" and doc["partial"] is True and doc["done"] is True, doc
    assert requests == 1
    assert doc["steps"] == 1
    assert doc["usage"]["total_tokens"] == 600 and doc["usage"]["own"] == _usage(500, 100), doc
    budget = [e for e in events_of(done) if e.get("event") == "loop.budget"]
    assert budget and budget[0]["budget"] == "token_ceiling", budget


def _tree_reply(deep: bool) -> Any:
    """The root spawns one child (which, ``deep``, spawns a grandchild first); each answers; the root finishes."""

    def reply(request: RecordedRequest) -> dict[str, Any]:
        said = " ".join(str(m.get("content")) for m in request.messages)
        observed = any(m.get("role") == "tool" for m in request.messages)
        if "GRANDCHILD TASK" in said:
            return text("grandchild answer", usage={"prompt_tokens": 20, "completion_tokens": 3})
        if "CHILD TASK" in said:
            if deep and not observed:
                return {**tool_call("subagent_spawn", {"instruction": "GRANDCHILD TASK: answer"}),
                        "usage": {"prompt_tokens": 40, "completion_tokens": 7}}
            return text("child answer", usage={"prompt_tokens": 30, "completion_tokens": 4} if deep
                        else {"prompt_tokens": 40, "completion_tokens": 7})
        if observed:
            return text("root answer", usage={"prompt_tokens": 200, "completion_tokens": 20})
        return {**tool_call("subagent_spawn", {"instruction": "CHILD TASK: answer"}),
                "usage": {"prompt_tokens": 100, "completion_tokens": 10}}

    return reply


@pytest.mark.parametrize("deep", [False, True], ids=["child", "grandchild"])
async def test_the_result_usage_is_the_whole_trees_and_the_spawn_result_carries_the_childs(deep: bool) -> None:
    async with scripted_gateway(default=_tree_reply(deep)) as gw:
        done = await run_agentd(["--instruction", "delegate", "--intelligence", gw.url])
        requests = list(gw.requests)
    doc = _doc(done)
    assert done.returncode == 0 and doc["status"] == "completed", (doc, done.stderr.decode()[-3000:])
    assert len(requests) == (5 if deep else 3)
    # the subtree below the root: the child's 40+7 (deep: 40+7 and 30+4, and the grandchild's 20+3)
    child = _usage(90, 14) if deep else _usage(40, 7)
    # the root's own 100+10 and 200+20, and the subtree, each once
    assert doc["usage"]["own"] == _usage(300, 30), doc
    assert {k: doc["usage"][k] for k in child} == _usage(300 + child["prompt_tokens"],
                                                         30 + child["completion_tokens"]), doc
    # the spawn result the root's model read carries the child subtree's usage
    observation = next(m for m in requests[-1].messages if m.get("role") == "tool")
    spawned = json.loads(observation["content"])
    assert spawned["status"] == "completed" and spawned["usage"] == child, spawned
    assert "estimated_tokens" not in doc["usage"]
