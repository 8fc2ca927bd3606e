"""server-everything starts and answers; launchers leave no process behind; the leak detector detects leaks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest
import trio

from tests.peers import launch, proctree
from tests.peers.rawclient import LegacySession

pytestmark = pytest.mark.interop


async def test_everything_server_echo(everything_server: launch.PeerProcess) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(15):
            s = LegacySession(client, everything_server.url)
            init = await s.initialize()
            tools, _ = await s.list_all("tools/list", "tools")
            echo = await s.request("tools/call", {"name": "echo", "arguments": {"message": "hello"}})
    assert init["serverInfo"]["name"]
    assert "echo" in {t["name"] for t in tools}
    assert "hello" in echo["content"][0]["text"]


def test_start_peer_stop_reaps_the_group(no_leftover_children: None) -> None:
    peer = launch.start_peer(launch.sdk_server_argv())
    pid = peer.pid
    assert pid in proctree.descendants()
    peer.stop()
    assert pid not in proctree.descendants()
    peer.stop()  # idempotent


def test_start_peer_reports_early_exit(no_leftover_children: None) -> None:
    with pytest.raises(launch.PeerStartError, match="exited"):
        launch.start_peer([sys.executable, "-c", "print('nope')"])


def test_start_peer_times_out(no_leftover_children: None) -> None:
    with pytest.raises(launch.PeerStartError, match="not ready"):
        launch.start_peer([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)


async def test_async_peer_server_kills_on_exit(no_leftover_children: None) -> None:
    with trio.fail_after(20):
        async with launch.peer_server(launch.sdk_server_argv(tools=2)) as peer:
            async with httpx.AsyncClient(timeout=5) as client:
                s = LegacySession(client, peer.url)
                await s.initialize()
                tools, _ = await s.list_all("tools/list", "tools")
            assert len(tools) == 9
        assert peer.proc.returncode is not None


async def test_async_peer_server_startup_failure(no_leftover_children: None) -> None:
    with trio.fail_after(10), pytest.raises(launch.PeerStartError):
        async with launch.peer_server([sys.executable, "-c", "raise SystemExit(3)"]):
            pass


def test_leak_detector_sees_live_and_zombie_children() -> None:
    before = proctree.descendants()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        left = {p.pid: p for p in proctree.leftovers(before, grace=0.2)}
        assert live.pid in left and left[live.pid].state != "Z"
        assert left[zombie.pid].zombie
        assert proctree.leftovers(before, grace=0.2, ignore=frozenset({live.pid, zombie.pid})) == []
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait()
        zombie.wait()
    assert proctree.leftovers(before, grace=0.5) == []


def test_inspector_cli_against_sdk_peer(sdk_server: launch.PeerProcess) -> None:
    if not (launch.INSPECTOR_DIR / "index.js").exists():
        if os.environ.get("AGENTD_TEST_REQUIRE_PEERS") == "1":
            pytest.fail("inspector-cli not installed")
        pytest.skip("inspector-cli not installed (run scripts/test)")
    tools = launch.inspector(sdk_server.url, "--method", "tools/list")
    called = launch.inspector(sdk_server.url, "--method", "tools/call", "--tool-name", "echo",
                              "--tool-arg", "text=inspected")
    assert "echo" in {t["name"] for t in tools["tools"]}
    assert called["content"][0]["text"] == "inspected"
