"""Real agentd daemon processes for the crash tests: started, waited on until a condition holds, SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from tests.waiting import until

#: The repository root (the daemons run from it, importing this checkout's agentd).
ROOT = str(Path(__file__).resolve().parents[2])


def daemon_env() -> dict[str, str]:
    """This environment without any AGENTD_/AGENT_ settings of the caller's."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENT")}


@asynccontextmanager
async def daemon(argv: Sequence[str], stderr: Path) -> AsyncIterator[trio.Process]:
    """Run ``argv`` (its stderr to the file ``stderr``) for the block, then SIGKILL it."""
    with open(stderr, "wb") as err:
        proc = await trio.lowlevel.open_process(list(argv), stdout=subprocess.DEVNULL, stderr=err,
                                                env=daemon_env(), cwd=ROOT)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGKILL)
            with trio.fail_after(10):
                await proc.wait()


async def wait_until(proc: trio.Process, stderr: Path, ready: Callable[[], bool]) -> None:
    """Poll ``ready()`` (at most 60 s), failing with ``stderr``'s tail if ``proc`` exits first."""
    def up_and_ready() -> bool:
        assert proc.poll() is None, stderr.read_text()[-3000:]
        return ready()

    await until(up_and_ready, timeout=60)


async def daemon_until(argv: Sequence[str], stderr: Path, ready: Callable[[], bool]) -> None:
    """Run ``argv`` until ``ready()`` (polled; at most 60 s, failing with its stderr if it exits), then SIGKILL."""
    async with daemon(argv, stderr) as proc:
        await wait_until(proc, stderr, ready)
