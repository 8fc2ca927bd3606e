"""A served run tree's token budget survives a SIGKILL (``--serve-mcp`` with ``--state-dir``): a served warm
session and the subagent it spawns spend part of ``--token-ceiling``, the daemon is SIGKILLed, and the saved
books (namespace ``budget.served``) show the spend; an async served run in flight at the crash is resumed in its
own tree (its books kept); the restarted daemon re-opens the session in the same tree, so its next turns are charged against what was left and the turn that passes the ceiling is cancelled
(``reason: token_ceiling``) — the tree never gets a fresh ceiling from the crash."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.journal.ledger import SERVED_NAMESPACE
from agentd.journal.sqlite import JournalFile, db_path
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.integration.agents import Worker, agentd_worker, text_of
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.waiting import until

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]

CEILING = 6000


def _usage(tokens: int) -> dict[str, Any]:
    return {"usage": {"prompt_tokens": tokens, "completion_tokens": 0}}


def reply(request: RecordedRequest) -> dict[str, Any]:
    said = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
    last = request.messages[-1] if request.messages else {}
    if "ASYNC" in said:  # in flight at the SIGKILL, and again once resumed
        return text("never seen", delay=600)
    if "WARM-3" in said:
        return text("one more", **_usage(2000))  # 5000 + 2000 > 6000: past the tree's ceiling
    if "WARM-2" in said:
        return text("the number was 42", **_usage(3000))
    if "GRANDCHILD" in said:
        return text("counted", **_usage(600))
    if last.get("role") == "tool":
        return text("noted 42", **_usage(400))
    if "WARM-1" in said:  # the served session spawns a subagent of its own, with a slice of its tree
        return tool_call("subagent_spawn", {"instruction": "GRANDCHILD: count to 3", "token_budget": 2000},
                         **_usage(1000))
    return text("fine")


def _served_books(state: Path) -> dict[str, Any]:
    if not os.path.exists(db_path(str(state))):
        return {}
    journal = JournalFile(db_path(str(state)), readonly=True)
    try:
        return dict(journal.get_state(SERVED_NAMESPACE))
    finally:
        journal.close()


def _root(state: Path, tree: str) -> list[Any] | None:
    book = _served_books(state).get(tree)
    return book["slices"]["root"] if isinstance(book, dict) else None


def _client(worker: Worker) -> Any:
    server = McpServerConfig(name="worker", url=worker.url)
    return open_mcp_pool([server], log=EventLog(sink=lambda line: None), secrets=SecretResolver(env={}),
                         run_id="test")


async def _structured(pool: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    answer = await pool.call_tool("worker", tool, arguments)
    assert answer.structured is not None, answer
    return dict(answer.structured)


async def _turn(pool: Any, handle: str, message: str, turns: int | None) -> dict[str, Any]:
    """Send ``message``; the view once the session answered it (``turns``) or, with None, once it ended."""
    sent = await _structured(pool, "subagent.send", {"handle": handle, "message": message})
    assert sent["accepted"] is True, sent

    async def answered() -> dict[str, Any] | None:
        view = await _structured(pool, "subagent.status", {"handle": handle})
        return view if view["done"] or (turns is not None and view.get("turns") == turns
                                        and view["status"] == "awaiting_turn") else None

    return dict(await until(answered, timeout=60, what=f"{handle} answered"))


async def test_a_served_tree_spends_within_its_ceiling_across_a_sigkill(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with scripted_gateway(default=reply) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0", "--intelligence", gw.url, "--state-dir", str(state),
                "--token-ceiling", str(CEILING), "--drain-timeout", "3", "--cancel-grace", "1"]
        async with agentd_worker(argv) as worker:
            with trio.fail_after(60):
                async with _client(worker) as pool:
                    warm = await _structured(pool, "subagent.spawn", {"instruction": "WARM-1: remember 42",
                                                                      "warm": True})
                    assert warm["handle"] == "served.1" and warm["result"] == "noted 42", warm
                    # served.1 spent 1000 + 400, its subagent served.1.1 600 of its 2000 slice (1400 came back)
                    await until(lambda: _root(state, "served.1") == [None, CEILING, 2000], timeout=60,
                                what="served.1's books at 2000")
                    lost = await _structured(pool, "subagent.spawn", {"instruction": "ASYNC: wait", "async": True})
                    assert lost["handle"] == "served.2"
                    await until(lambda: any("ASYNC" in str(r.messages) for r in gw.requests), timeout=60,
                                what="the async spawn's model request")
            assert any("GRANDCHILD" in str(r.messages) for r in gw.requests)
            os.kill(worker.pid, signal.SIGKILL)

        books = _served_books(state)
        assert books["served.1"]["slices"] == {"root": [None, CEILING, 2000]} and "served.2" in books
        async with agentd_worker(argv) as worker:
            with trio.fail_after(90):
                async with _client(worker) as pool:
                    idle = await _structured(pool, "subagent.status", {"handle": "served.1"})
                    assert idle["status"] == "awaiting_turn", idle
                    resumed = await _structured(pool, "subagent.status", {"handle": "served.2"})
                    assert resumed["status"] == "running" and not resumed["done"], resumed
                    assert "served.2" in _served_books(state)  # a resumed run's tree goes on
                    view = await _turn(pool, "served.1", "WARM-2: which number?", 2)
                    assert view["result"] == "the number was 42" and not view["done"], view
                    restored = [(e["tree"], e["committed"], e["ceiling"]) for e in worker.named("budget.restored")]
                    assert ("served.1", 2000, CEILING) in restored, restored
                    await until(lambda: _root(state, "served.1") == [None, CEILING, 5000], timeout=60,
                                what="the re-opened session's turn in the books")

                    view = await _turn(pool, "served.1", "WARM-3: and then?", None)
                    assert view["done"] and view["status"] == "cancelled", view  # 7000 > 6000: stopped
                    cancels = [e for e in worker.named("subagent.cancel") if e.get("reason") == "token_ceiling"]
                    assert cancels, worker.named("subagent.cancel")

                    fresh = await _structured(pool, "subagent.spawn", {"instruction": "hello", "async": True})
                    assert fresh["handle"] == "served.5"  # after the resumed run's and re-opened session's children
