"""Real agentd daemon processes for the crash tests: started, waited on until a condition holds, SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from agentd.journal.sqlite import JournalFile, db_path
from agentd.modes.events import EVENT_CURSORS
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


def event_cursor(state: Path, key: str) -> Any:
    """The journaled cursor of the event subscription ``key`` in the state dir ``state`` (None: none yet)."""
    if not os.path.exists(db_path(str(state))):
        return None
    journal = JournalFile(db_path(str(state)), readonly=True)
    try:
        return journal.get_state(EVENT_CURSORS).get(key)
    finally:
        journal.close()


def wakes_with(gw: Any, event_id: str) -> int:
    """Runs whose instruction carried ``event_id`` (each run's first model request)."""
    marker = f'eventId="{event_id}"'
    return sum(1 for r in gw.requests if len(r.messages) <= 2 and any(
        m.get("role") == "user" and marker in str(m.get("content")) for m in r.messages))
