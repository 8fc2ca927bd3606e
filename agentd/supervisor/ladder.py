"""The kill ladder: how a child process is ended, politely first and certainly last.

Rungs, each tried only if the child is still alive: ``cancel`` frame on the channel → wait ``cancel``
grace (the child cancels its own subtree first, so the tree dies deepest first) → close its stdin (EOF)
→ wait ``eof`` grace → SIGTERM to its process group → wait ``term`` grace → SIGKILL to the group → reap.
Every wait is bounded, so the whole ladder takes at most the sum of the graces plus a reap bound; callers
run it shielded from cancellation. The child is the leader of its own process group
(``start_new_session=True``), so a signal to the group also reaches anything it forked itself.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from agentd import defaults

#: Reaping after SIGKILL is immediate on Linux; the bound only guards against a kernel in trouble.
_REAP_BOUND = 5.0


class ChildProcess(Protocol):
    """What the ladder needs of a child: ``trio.Process`` (re-exec) or a fork server's child."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def send_signal(self, sig: int) -> None: ...


@attrs.frozen
class Graces:
    cancel: float = defaults.CANCEL_GRACE
    eof: float = defaults.EOF_GRACE
    term: float = defaults.TERM_GRACE


def _exited(proc: ChildProcess) -> bool:
    return proc.returncode is not None


async def _wait_exit(proc: ChildProcess, grace: float) -> bool:
    with trio.move_on_after(grace):
        await proc.wait()
    return _exited(proc)


def _signal_group(proc: ChildProcess, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        # The group is gone (or the leader was reaped and its pid reused outside our group): try the
        # process itself, which trio only signals while it is unreaped.
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


async def run_ladder(
    proc: ChildProcess,
    *,
    graces: Graces,
    send_cancel: Callable[[], Awaitable[None]] | None,
    close_stdin: Callable[[], Awaitable[None]],
    on_rung: Callable[[str], None] = lambda rung: None,
) -> str:
    """End ``proc``; return the rung that ended it: exited, cancel, eof, sigterm or sigkill.

    ``send_cancel`` is None when the child already finished its work and is expected to exit on its own
    (then the first grace is just a wait). Callers must shield this from cancellation.
    """
    if _exited(proc):
        return "exited"
    if send_cancel is not None:
        on_rung("cancel")
        with trio.move_on_after(graces.cancel) as scope:
            try:
                await send_cancel()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            await proc.wait()
        if not scope.cancelled_caught and _exited(proc):
            return "cancel"
    elif await _wait_exit(proc, graces.cancel):
        return "exited"
    on_rung("eof")
    with trio.move_on_after(graces.eof):
        await close_stdin()
    if await _wait_exit(proc, graces.eof):
        return "eof"
    on_rung("sigterm")
    _signal_group(proc, signal.SIGTERM)
    if await _wait_exit(proc, graces.term):
        return "sigterm"
    on_rung("sigkill")
    _signal_group(proc, signal.SIGKILL)
    await _wait_exit(proc, _REAP_BOUND)
    return "sigkill"
