"""A real agentd process for the operator-control tests, and ``agentd ctl`` run as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from tests.waiting import until

ROOT = str(Path(__file__).resolve().parents[2])


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENT")}


async def ctl(*args: str, timeout: float = 30) -> tuple[int, dict[str, Any]]:
    """``agentd ctl ARGS``: its exit code and its one JSON document (``{}`` when stdout is empty)."""
    with trio.fail_after(timeout):
        done = await trio.run_process([sys.executable, "-m", "agentd", "ctl", *args], capture_stdout=True,
                                      capture_stderr=True, check=False, env=env(), cwd=ROOT)
    out = done.stdout.decode()
    assert out.count("\n") <= 1, out
    return done.returncode, json.loads(out) if out.strip() else {}


@attrs.define(eq=False)
class Daemon:
    proc: trio.Process
    stdout: Path
    stderr: Path

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = self.stderr.read_text().splitlines() if self.stderr.exists() else []
        found = [json.loads(line) for line in lines if line.startswith("{") and f'"{name}"' in line]
        return [e for e in found if e.get("event") == name]

    def alive(self) -> bool:
        return self.proc.poll() is None

    async def until(self, ready: Callable[[], Any], timeout: float = 60) -> None:
        """Poll ``ready()`` (a condition on the outside world) until it holds; the daemon must stay up."""
        def up_and_ready() -> Any:
            assert self.alive(), self.stderr.read_text()[-3000:]
            return ready()

        await until(up_and_ready, timeout=timeout)

    async def until_status(self, sock: str, check: Callable[[dict[str, Any]], bool], timeout: float = 60
                           ) -> dict[str, Any]:
        async def status() -> dict[str, Any] | None:
            assert self.alive(), self.stderr.read_text()[-3000:]
            code, doc = await ctl("status", "--socket", sock)
            return doc if code == 0 and check(doc) else None

        return dict(await until(status, timeout=timeout, what="the status"))

    async def wait(self, timeout: float = 60) -> tuple[int, dict[str, Any]]:
        with trio.fail_after(timeout):
            await self.proc.wait()
        out = self.stdout.read_text()
        return self.proc.returncode, json.loads(out) if out.strip() else {}


@asynccontextmanager
async def daemon(argv: Sequence[str], tmp: Path, name: str = "agentd") -> AsyncIterator[Daemon]:
    """Start ``python -m agentd ARGV``; SIGKILL it at the end of the block if it is still running."""
    out, err = tmp / f"{name}.stdout", tmp / f"{name}.stderr"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = await trio.lowlevel.open_process([sys.executable, "-m", "agentd", *argv], stdout=stdout,
                                                stderr=stderr, env=env(), cwd=ROOT)
        try:
            yield Daemon(proc, out, err)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            with trio.move_on_after(10):
                await proc.wait()


def kill(d: Daemon) -> None:
    d.proc.send_signal(signal.SIGKILL)


__all__ = ["ROOT", "Daemon", "ctl", "daemon", "env", "kill"]
