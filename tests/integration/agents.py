"""Real agentd processes for integration tests: a serving worker (``--serve-mcp``) and one-shot parents.

A worker is started with ``python -m agentd``; it is ready when it logs ``serve.start``. Its stderr events
are collected as parsed JSON (``Worker.events``) and its stdout (the run's result object) is read once it
exits. Every wait is bounded; a worker still running at the end of the block is SIGTERMed (drain, exit 0)
and, failing that, killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
import trio

ROOT = Path(__file__).resolve().parents[2]
AGENTD = [sys.executable, "-m", "agentd"]


@attrs.define(eq=False)
class Worker:
    url: str = ""
    events: list[dict[str, Any]] = attrs.field(factory=list)
    stdout: bytes = b""
    returncode: int | None = None
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _pid: int = 0
    _drained: bool = False

    def drain(self) -> None:
        """SIGTERM now (the test drives the drain); the block's end then waits for the exit, signalling no
        more (a second signal would force the exit)."""
        self._drained = True
        os.kill(self._pid, signal.SIGTERM)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/")[0])

    @property
    def run_id(self) -> str:
        return str(self.named("serve.start")[0]["run_id"])

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    def result(self) -> dict[str, Any]:
        return dict(json.loads(self.stdout.decode().strip().splitlines()[-1]))

    def _add(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_event(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first logged event satisfying ``predicate`` (bound the wait with ``trio.fail_after``)."""
        while True:
            for event in self.events:
                if predicate(event):
                    return event
            await self._changed.wait()


@asynccontextmanager
async def agentd_worker(argv: list[str], *, env: dict[str, str] | None = None, serving: bool = True,
                        stop_timeout: float = 30.0, prefix: Sequence[str] = ()) -> AsyncIterator[Worker]:
    """``agentd *argv``; yields once it serves (``--serve-mcp``; with ``serving=False`` at once), and
    drains it with SIGTERM at the end of the block unless it already exited. With a ``prefix`` (say
    ``ip netns exec NAME``, tests/peers/netns.py) it runs as ``*prefix agentd *argv`` in a process group of
    its own, SIGKILLed as a whole at the end."""
    proc = await trio.lowlevel.open_process(
        [*prefix, *AGENTD, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        env={**os.environ, **(env or {})}, start_new_session=bool(prefix),
    )
    assert proc.stdout is not None and proc.stderr is not None
    worker = Worker(pid=proc.pid)
    started = trio.Event()
    out = bytearray()

    async def read_stderr() -> None:
        assert proc.stderr is not None
        rest = b""
        while chunk := await proc.stderr.receive_some(65536):
            rest += chunk
            *complete, rest = rest.split(b"\n")
            for raw in complete:
                try:
                    event = json.loads(raw)
                except ValueError:
                    event = {"event": "non-json", "text": raw.decode(errors="replace")}
                worker._add(event)
                if serving and event.get("event") == "serve.start" and not started.is_set():
                    worker.url = event["urls"][0]
                    started.set()
        started.set()  # exited before serving: the caller's assertion says so

    async def read_stdout() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.receive_some(65536):
            out.extend(chunk)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stderr)
            nursery.start_soon(read_stdout)
            if serving:
                with trio.fail_after(60):
                    await started.wait()
                assert worker.url, "worker exited before serving: " + json.dumps(worker.events[-5:])
            yield worker
            if proc.returncode is None and not worker._drained:
                proc.send_signal(signal.SIGTERM)
            with trio.fail_after(stop_timeout):
                worker.returncode = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await proc.wait()
        if prefix:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        worker.stdout = bytes(out)


async def run_agentd(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 90.0,
                     prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[bytes]:
    """One agentd run to its end (stdout and stderr captured), as ``*prefix agentd *argv``."""
    with trio.fail_after(timeout):
        return await trio.run_process([*prefix, *AGENTD, *argv], capture_stdout=True, capture_stderr=True,
                                      cwd=ROOT, env={**os.environ, **(env or {})}, check=False)


def events_of(done: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    """The JSON event lines of a finished run's stderr."""
    return [json.loads(line) for line in done.stderr.decode().splitlines() if line.startswith("{")]


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else json.dumps(content)
