"""A whole run cancelled (deadline, from outside) while a tools/call is in flight sends notifications/cancelled."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import trio

import agentd
from agentd.telemetry.events import EventLog
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.waiting import until

pytestmark = [pytest.mark.interop]


@pytest.fixture
def peer() -> Iterator[launch.PeerProcess]:
    """A fresh peer per test: it keys cancellations by request id, and ids restart with every session."""
    with launch.start_peer(launch.sdk_server_argv()) as started:
        yield started


def _cfg(*args: str) -> agentd.Config:
    return agentd.load_config(["--instruction", "do the task", *args], env={})


async def _wait_cancelled(url: str, before: int) -> dict[str, Any]:
    async def more() -> list[dict[str, Any]] | None:
        records = await trio.to_thread.run_sync(launch.cancelled, url)
        return records if len(records) > before else None

    return (await until(more, timeout=10, what="the peer recorded the cancel"))[-1]


async def test_run_deadline_cancels_the_inflight_call(peer: launch.PeerProcess) -> None:
    before = len(launch.cancelled(peer.url))
    lines: list[dict[str, Any]] = []
    async with scripted_gateway([tool_call("sdk__slow", {"seconds": 30}), text("unused")]) as gw:
        cfg = _cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}", "--deadline", "1")
        with trio.fail_after(20):
            result = await agentd.main(cfg, log=EventLog(sink=lines.append))
    assert result.status is agentd.RunStatus.DEADLINE
    record = await _wait_cancelled(peer.url, before)
    assert record["via"] == "notification", record
    assert any(line["event"] == "mcp.cancelled" for line in lines)


async def test_run_cancelled_from_outside_cancels_the_inflight_call(peer: launch.PeerProcess) -> None:
    before = len(launch.cancelled(peer.url))
    lines: list[dict[str, Any]] = []
    async with scripted_gateway([tool_call("sdk__slow", {"seconds": 30})]) as gw:
        cfg = _cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}")
        with trio.move_on_after(2) as scope:
            await agentd.main(cfg, log=EventLog(sink=lines.append))
    assert scope.cancelled_caught
    record = await _wait_cancelled(peer.url, before)
    assert record["via"] == "notification", record
    events = [line["event"] for line in lines]
    assert "mcp.cancelled" in events
    assert events.index("mcp.cancelled") < events.index("mcp.closed")


def _clean_env() -> dict[str, str]:
    from tests.cli.helpers import clean_env

    return clean_env()


async def test_sigterm_drain_timeout_cancels_the_inflight_call(peer: launch.PeerProcess) -> None:
    """``python -m agentd`` stuck in a tools/call: SIGTERM, then --drain-timeout cancels the run; the call is
    cancelled on the server (notifications/cancelled) before the session is closed."""
    import json
    import signal
    import sys

    before = len(launch.cancelled(peer.url))
    async with scripted_gateway([tool_call("sdk__slow", {"seconds": 30}), text("unused")]) as gw:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                proc = await nursery.start(functools.partial(
                    trio.run_process,
                    [sys.executable, "-m", "agentd", "--instruction", "x", "--intelligence", gw.url,
                     "--mcp", f"sdk={peer.url}", "--drain-timeout", "300ms"],
                    env=_clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    check=False,
                ))
                events: list[dict[str, Any]] = []
                buffer = b""
                assert proc.stderr is not None and proc.stdout is not None
                async for chunk in proc.stderr:
                    buffer += chunk
                    *complete, buffer = buffer.split(b"\n")
                    events += [json.loads(line) for line in complete if line.strip()]
                    if any(e["event"] == "tool.call" for e in events):
                        break
                await trio.sleep(0.3)  # real time: the tools/call is on the wire to the real peer
                proc.send_signal(signal.SIGTERM)
                async for chunk in proc.stderr:
                    buffer += chunk
                out = b""
                async for chunk in proc.stdout:
                    out += chunk
                await proc.wait()
    events += [json.loads(line) for line in buffer.split(b"\n") if line.strip()]
    assert proc.returncode == 0, events[-5:]
    names = [e["event"] for e in events]
    assert "mcp.cancelled" in names, names
    assert names.index("mcp.cancelled") < names.index("mcp.closed")
    record = await _wait_cancelled(peer.url, before)
    assert record["via"] == "notification", record


async def test_subagent_cancelled_by_its_parent_cancels_the_inflight_call(
    peer: launch.PeerProcess, no_leftover_children: None
) -> None:
    """A real child process in a tools/call; its parent cancels it (the kill ladder's cancel message)."""
    from agentd.supervisor.supervisor import Caller, Origin, SpawnRequest
    from agentd.supervisor.wiring import open_root_supervisor

    before = len(launch.cancelled(peer.url))
    calls = launch.stats(peer.url)["requests"].get("tools/call", 0)
    lines: list[dict[str, Any]] = []
    root = Caller(Origin.STDIO, "0")
    async with scripted_gateway([tool_call("sdk__slow", {"seconds": 30}), text("unused")]) as gw:
        cfg = _cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}")
        with trio.fail_after(40):
            async with open_root_supervisor(cfg, log=EventLog(sink=lines.append), env={}) as sup:
                view = await sup.spawn(root, SpawnRequest("child task", async_=True))
                assert not isinstance(view, Exception) and hasattr(view, "handle"), view
                await until(lambda: launch.stats(peer.url)["requests"].get("tools/call", 0) > calls, timeout=40,
                            what="the child's tools/call at the peer")
                await trio.sleep(0.2)  # real time: the peer's slow tool is running when the cancel comes
                ended = await sup.cancel(root, view.handle, "the parent changed its mind")
                assert getattr(ended, "status", None) == "cancelled", ended
    record = await _wait_cancelled(peer.url, before)
    assert record["via"] == "notification", record
    assert record["reason"] == "the request was cancelled"


async def test_modern_wire_run_cancelled_closes_the_call_stream() -> None:
    """On the 2026-07-28 wire the cancellation is the closed response stream: no notification is sent."""
    with launch.start_peer(launch.modern_server_argv()) as modern:
        async with scripted_gateway([tool_call("m__slow", {"seconds": 30})]) as gw:
            cfg = _cfg("--intelligence", gw.url, "--mcp", f"m={modern.url}")
            with trio.move_on_after(2) as scope:
                await agentd.main(cfg, log=EventLog(sink=lambda line: None))
        assert scope.cancelled_caught
        record = await _wait_cancelled(modern.url, 0)
        assert record["via"] == "disconnect" and record["method"] == "tools/call"
        assert "notifications/cancelled" not in launch.stats(modern.url)["requests"]
