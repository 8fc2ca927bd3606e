"""The tree's money budget survives a crash: a once run with ``--budget-usd`` and ``--state-dir`` spends part of
its budget, is SIGKILLed, and the restarted run (same ``--run-id``) still counts what was spent before the crash:
its next reply spends the rest, it ends ``exhausted_budget`` (exit 7), and the tool call that reply asked for is
never sent. A warm served session keeps the model its spawn chose when it is re-opened after a SIGKILL."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from agentd.journal.ledger import MONEY_KEY, NAMESPACE, ROOT, Ledger
from agentd.journal.sqlite import JournalFile, db_path
from tests.ctl.daemon import daemon, kill
from tests.durable.peer import counting_peer
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.waiting import until

pytestmark = pytest.mark.interop

RUN = "money-1"
#: What one reply of 1000 prompt tokens costs at $3 per million, in picodollars: $0.003.
REPLY = 1000 * 3 * 10**6


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
    money = book.get(MONEY_KEY) if isinstance(book, dict) else None
    return 0 if money is None else Ledger.restore_beside(money, Ledger.restore(book)).spent(ROOT)


async def test_the_money_ledger_holds_across_a_sigkill(tmp_path):
    state = tmp_path / "state"
    # Every reply charges (not idempotent: after the crash its outcome is unknown, it is not sent again) and
    # costs $0.003; the budget is $0.005: the second reply, in the restarted process, spends it.
    reply = tool_call("pay__charge", {"key": "k1", "hold": "after"}, usage={"prompt_tokens": 1000,
                                                                            "completion_tokens": 0})
    async with scripted_gateway([], default=reply) as gw, counting_peer() as peer:
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--instruction", "Charge k1.",
                "--run-id", RUN, "--state-dir", str(state), "--model", "big", "--price", "big=3/15",
                "--budget-usd", "0.005", "--deadline", "120s"]
        async with daemon(argv, tmp_path, "first") as d:
            # the charge ran (and hangs) and the first reply's $0.003 is booked
            await d.until(lambda: peer.count("charge") == 1 and _root_spent(state) == REPLY)
            kill(d)
            await d.wait()
        before = len(gw.requests)

        async with daemon(argv, tmp_path, "second") as d:
            code, result = await d.wait(timeout=90)
        stderr = d.stderr.read_text()
        assert code == 7 and result["status"] == "exhausted_budget", stderr[-3000:]
        assert len(gw.requests) == before + 1  # one reply more, then nothing: the budget is spent
        assert peer.count("charge") == 1  # that reply's charge was never sent
        restored = d.events("budget.restored")
        assert len(restored) == 1 and restored[0]["spent_usd_pico"] == REPLY, restored
        # the document counts both replies' cost: the restored run's usage includes the first process's
        assert result["usage"]["cost_usd"] == 0.006, result


async def test_a_warm_served_session_keeps_its_model_across_a_sigkill(tmp_path):
    from agentd.client import open_mcp_pool
    from agentd.config.model import McpServerConfig
    from agentd.security.secrets import SecretResolver
    from agentd.telemetry.events import EventLog
    from tests.integration.agents import agentd_worker

    def client(worker):
        return open_mcp_pool([McpServerConfig(name="worker", url=worker.url)], log=EventLog(sink=lambda line: None),
                             secrets=SecretResolver(env={}), run_id="test")

    state = tmp_path / "state"
    async with scripted_gateway([], default=text("noted")) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0", "--intelligence", gw.url, "--model", "big", "--models", "small",
                "--state-dir", str(state), "--drain-timeout", "3", "--cancel-grace", "1"]
        async with agentd_worker(argv) as worker:
            with trio.fail_after(60):
                async with client(worker) as pool:
                    warm = await pool.call_tool("worker", "subagent.spawn",
                                                {"instruction": "WARM-1", "warm": True, "model": "small"})
                    assert warm.is_error is False and warm.structured["turns"] == 1, warm
            os.kill(worker.pid, signal.SIGKILL)
        before = len(gw.requests)

        async with agentd_worker(argv) as worker:
            with trio.fail_after(90):
                async with client(worker) as pool:
                    sent = await pool.call_tool("worker", "subagent.send", {"handle": "served.1", "message": "WARM-2"})
                    assert sent.is_error is False, sent
                    await until(lambda: len(gw.requests) > before, timeout=90, what="the next model request")
        assert {r.body.get("model") for r in gw.requests} == {"small"}  # the re-opened session too
