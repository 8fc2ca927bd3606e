"""The real command line in reactive mode: SIGTERM during a wake drains (the wake finishes), unsubscribes,
closes the session and exits 0 with one JSON document on stdout."""

import json
import os
import signal
import subprocess
import sys

import pytest
import trio

from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text
from tests.waiting import until

pytestmark = pytest.mark.interop


async def test_sigterm_during_a_wake_drains_and_exits_0(no_leftover_children: None) -> None:
    draining = trio.Event()  # the wake's model call answers once the drain has begun: in flight at the SIGTERM
    async with scripted_gateway(default={**text("done"), "wait": draining}) as gw, \
            launch.peer_server(launch.sdk_server_argv()) as peer:
        argv = [sys.executable, "-m", "agentd", "--mode", "reactive", "--instruction", "watch the counter",
                "--intelligence", gw.url, "--mcp", f"srv={peer.url}", "--subscribe", "test://counter",
                "--debounce", "50ms", "--drain-timeout", "10s", "--run-id", "cli-drain"]
        proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.stdout is not None and proc.stderr is not None
        lines: list[dict] = []
        stdout = bytearray()

        async def read_stderr() -> None:
            buf = b""
            async for chunk in proc.stderr:  # type: ignore[union-attr]
                buf += chunk
                *complete, buf = buf.split(b"\n")
                lines.extend(json.loads(raw) for raw in complete if raw.strip().startswith(b"{"))

        async def read_stdout() -> None:
            async for chunk in proc.stdout:  # type: ignore[union-attr]
                stdout.extend(chunk)

        async def seen(name: str, timeout: float = 20, **fields: object) -> None:
            def logged() -> bool:
                if proc.returncode is not None:
                    raise AssertionError(f"agentd exited {proc.returncode}: {[e['event'] for e in lines]}")
                return any(e["event"] == name and all(e.get(k) == v for k, v in fields.items()) for e in lines)

            await until(logged, timeout=timeout, what=name)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_stderr)
                nursery.start_soon(read_stdout)
                await seen("trigger.armed")
                await launch.abump(peer.url)
                await until(lambda: gw.requests, timeout=20, what="the wake's model call")
                proc.send_signal(signal.SIGTERM)  # the wake's model call is still in flight (held)
                await seen("drain.start")
                draining.set()
                with trio.fail_after(20):
                    code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stats = launch.stats(peer.url)
    assert code == 0, [e["event"] for e in lines]
    document = json.loads(stdout.decode())
    assert document["status"] == "completed" and document["run_id"] == "cli-drain"
    events = [e["event"] for e in lines]
    assert "proc.signal" in events and "drain.start" in events and "drain.end" in events
    ends = [e for e in lines if e["event"] == "run.end" and e.get("trigger") == "wake"]
    assert [e["status"] for e in ends] == ["completed"]  # the running wake finished
    assert "resources/unsubscribe" in json.dumps(stats)


def _agentd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentd", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_reactive_without_subscribe_is_exit_2() -> None:
    done = _agentd("--mode", "reactive", "--instruction", "x", "--intelligence", "test")
    assert done.returncode == 2 and "--subscribe" in done.stderr


async def test_a_server_that_cannot_push_without_poll_interval_is_exit_2(no_leftover_children: None) -> None:
    from pathlib import Path

    argv = [sys.executable, str(Path(__file__).with_name("nosub_server.py"))]
    async with launch.peer_server(argv) as peer:
        done = await trio.to_thread.run_sync(lambda: _agentd(
            "--mode", "reactive", "--instruction", "x", "--intelligence", "test", "--mcp", f"nosub={peer.url}",
            "--subscribe", "test://polled"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "poll-interval" in done.stderr
