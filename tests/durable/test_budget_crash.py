"""The tree token budget survives a crash: a once run with ``--token-ceiling`` and ``--state-dir`` spends
part of its ceiling, is SIGKILLed, and the restarted run (same ``--run-id``) cannot reserve more for a
subagent than the ceiling minus what was spent before the crash."""

from __future__ import annotations

import os

import pytest

from agentd.journal.ledger import NAMESPACE
from agentd.journal.sqlite import JournalFile, db_path
from tests.ctl.daemon import daemon, kill
from tests.durable.peer import counting_peer
from tests.peers.gateway import Rule, scripted_gateway, text, tool_call

pytestmark = pytest.mark.interop

RUN = "budget-1"


def _books(state) -> dict[str, object]:
    if not os.path.exists(db_path(str(state))):
        return {}
    journal = JournalFile(db_path(str(state)), readonly=True)
    try:
        return journal.get_state(NAMESPACE)
    finally:
        journal.close()


def _root_spent(state) -> int:
    book = _books(state).get(RUN)
    return int(book["slices"]["root"][2]) if isinstance(book, dict) else 0


async def test_the_budget_ledger_holds_across_a_sigkill(tmp_path):
    state = tmp_path / "state"
    rules = [
        Rule({"last_contains": "spawn refused"}, text("no budget left for a helper", usage={"prompt_tokens": 10,
                                                                                              "completion_tokens": 0})),
        Rule({"last_role": "tool"}, tool_call("subagent_spawn", {"instruction": "CHILD: help", "token_budget": 500},
                                              usage={"prompt_tokens": 100, "completion_tokens": 0})),
    ]
    first = tool_call("pay__lookup", {"key": "k1", "hold": "after"}, usage={"prompt_tokens": 600,
                                                                            "completion_tokens": 0})
    async with scripted_gateway(rules=rules, default=first) as gw, counting_peer() as peer:
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--instruction", "Look k1 up.",
                "--run-id", RUN, "--state-dir", str(state), "--token-ceiling", "1000", "--deadline", "120s"]
        async with daemon(argv, tmp_path, "first") as d:
            # the lookup ran (and hangs) and the 600 tokens of the first reply are booked
            await d.until(lambda: peer.count("lookup") == 1 and _root_spent(state) == 600)
            kill(d)
            await d.wait()

        async with daemon(argv, tmp_path, "second") as d:
            code, result = await d.wait(timeout=90)
        stderr = d.stderr.read_text()
        assert code == 0 and result["status"] == "completed", stderr[-3000:]
        assert result["result"] == "no budget left for a helper"
        refusal = next(str(m.get("content")) for r in gw.requests for m in r.messages[-1:]
                       if m.get("role") == "tool" and "spawn refused" in str(m.get("content")))
        assert "token_budget=500 does not fit: handle 0 has 300 tokens left of token_ceiling=1000" in refusal
        assert not d.events("subagent.spawn")  # no child was started
        restored = d.events("budget.restored")
        assert len(restored) == 1 and restored[0]["committed"] == 600
    assert RUN not in _books(state)  # a finished run's books are forgotten


