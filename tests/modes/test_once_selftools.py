"""The ``subscribe`` self-tool in a once run (through the real command line, real resource servers).

A once run has no "after" (the process ends with it), so its ``subscribe`` is the in-run kind: the call
subscribes, waits for the next ``notifications/resources/updated`` of the URI (bounded by ``timeout_s`` and the
run's deadline), reads the resource again and returns its content, and unsubscribes. ``await_resource`` is
offered too; ``unsubscribe`` and ``schedule`` are not (nothing would apply them). Without an MCP server there
is nothing to subscribe to: ``subscribe`` is not offered, and a model that calls it anyway gets a clear
``isError`` observation naming what is offered, and the run goes on and completes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.agents import AGENTD, ROOT, run_agentd, text_of
from tests.peers import launch
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.waiting import until

pytestmark = pytest.mark.usefixtures("no_leftover_children")

COUNTER = "test://counter"


def _observe_then_answer(call: dict[str, Any]) -> Any:
    def reply(request: RecordedRequest) -> dict[str, Any]:
        tools = [m for m in request.messages if m.get("role") == "tool"]
        if not tools:
            return tool_call("subscribe", call)
        return text("observed: " + text_of(tools[-1].get("content")))

    return reply


async def _once(argv: list[str], err: Path, *, timeout: float = 90) -> tuple[int, dict[str, Any]]:
    """One once run of agentd, its stderr into ``err`` (read while it runs): exit code and result document."""
    with err.open("wb") as sink:
        proc = await trio.lowlevel.open_process([*AGENTD, *argv], stdout=subprocess.PIPE, stderr=sink, cwd=ROOT)
        try:
            assert proc.stdout is not None
            with trio.fail_after(timeout):
                out = b""
                while chunk := await proc.stdout.receive_some():
                    out += chunk
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                with trio.CancelScope(shield=True):
                    await proc.wait()
    return code, json.loads(out.decode())


async def _logged(err: Path, event: str) -> None:
    await until(lambda: err.exists() and f'"event":"{event}"' in err.read_text().replace(" ", ""), timeout=60,
                what=f"{event} in the log")


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_subscribe_in_a_once_run_waits_for_the_update_and_returns_the_fresh_content(era: str, tmp_path: Path
                                                                                         ) -> None:
    argv = launch.sdk_server_argv() if era == "legacy" else launch.modern_server_argv()
    async with scripted_gateway(default=_observe_then_answer({"uri": COUNTER, "timeout_s": 120})) as gw, \
            launch.peer_server(argv) as peer:
        err = tmp_path / "stderr"
        done: dict[str, Any] = {}

        async def run() -> None:
            done["code"], done["result"] = await _once(
                ["--instruction", "report the counter once it changes", "--intelligence", gw.url,
                 "--mcp", f"srv={peer.url}", "--deadline", "120s"], err)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await _logged(err, "trigger.armed")  # the call subscribed: the next update is the one it returns
            assert await launch.abump(peer.url) == 1
        stats = launch.stats(peer.url)
    assert done["code"] == 0, err.read_text()[-3000:]
    result = done["result"]
    assert result["status"] == "completed", result
    assert "subscribe: test://counter updated after 1 update(s)" in result["result"], result
    assert result["result"].endswith("\n1"), result
    offered = set(gw.requests[0].tool_names)
    assert {"subscribe", "await_resource"} <= offered and not {"unsubscribe", "schedule"} & offered, offered
    if era == "legacy":  # the subscription lasted for the call only
        assert stats["requests"].get("resources/unsubscribe") == stats["requests"].get("resources/subscribe") == 1
    else:
        assert stats["listens"] == 0, stats


async def test_subscribe_in_a_once_run_ends_at_its_timeout_as_an_observation(tmp_path: Path) -> None:
    reply = _observe_then_answer({"uri": "test://never", "timeout_s": 0.5})
    async with scripted_gateway(default=reply) as gw, launch.peer_server(launch.sdk_server_argv()) as peer:
        code, result = await _once(["--instruction", "wait for never", "--intelligence", gw.url,
                                    "--mcp", f"srv={peer.url}"], tmp_path / "stderr")
    assert code == 0 and result["status"] == "completed", result
    assert "subscribe: no matching update of test://never within 0.5 s" in result["result"], result


async def test_subscribe_in_a_once_run_is_bounded_by_the_run_deadline(tmp_path: Path) -> None:
    reply = _observe_then_answer({"uri": "test://never", "timeout_s": 3600})
    async with scripted_gateway(default=reply) as gw, launch.peer_server(launch.sdk_server_argv()) as peer:
        code, result = await _once(["--instruction", "wait for never", "--intelligence", gw.url,
                                    "--mcp", f"srv={peer.url}", "--deadline", "3s"], tmp_path / "stderr")
    assert result["status"] == "deadline", result
    assert code != 0
    assert len(gw.requests) == 1  # the wait was the run's last act


async def test_subscribe_without_an_mcp_server_is_refused_clearly_and_the_run_completes() -> None:
    def reply(request: RecordedRequest) -> dict[str, Any]:
        tools = [m for m in request.messages if m.get("role") == "tool"]
        if not tools:
            return tool_call("subscribe", {"uri": "file:///inbox"})
        return text("observed: " + text_of(tools[-1].get("content")))

    async with scripted_gateway(default=reply) as gw:
        done = await run_agentd(["--instruction", "watch the inbox", "--intelligence", gw.url], timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads(done.stdout.decode())
    assert result["status"] == "completed"
    assert "subscribe" not in [t for r in gw.requests for t in r.tool_names]
    assert "unknown tool 'subscribe'" in result["result"], result
