"""How a child knows its parent is gone: it refuses to start orphaned and watches the parent that started it.

Used by every child session and by the fork server itself, so no process of a tree outlives the supervisor
that owns it (a pidfd where the kernel has one, ``PR_SET_PDEATHSIG`` in forked children, a coarse poll else).
"""

from __future__ import annotations

import functools
import os
import signal
from typing import Any

import trio

_PR_SET_PDEATHSIG = 1

#: A pidfd of the parent, inherited from the fork server: set in a child forked for another forked child,
#: whose Unix parent is the fork server while its parent in the tree is the child that asked for it.
PARENT_PIDFD_ENV = "AGENTD_PARENT_PIDFD"


def die_with_parent() -> None:
    """Refuse to start orphaned; in a forked child, also ask the kernel for SIGKILL when the parent dies.

    ``PR_SET_PDEATHSIG`` fires when the parent *thread* exits. trio starts processes from a worker thread
    of its thread cache, which exits after idling, so the signal is armed only when the parent is the
    single-threaded fork server (``AGENTD_FORKED=1``). Every child also watches its parent (see
    :func:`wait_parent_gone`), which covers both cases.
    """
    if os.environ.get("AGENTD_FORKED") == "1":
        try:
            libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    inherited = _inherited_pidfd()
    if inherited is not None:
        if _has_exited(inherited):
            os._exit(1)  # the parent died before we got here
        return
    expected = expected_parent()
    if expected is not None and os.getppid() != expected:
        os._exit(1)  # the parent died before we got here


@functools.cache
def libc() -> Any:
    """The C library through ctypes, loaded once: the fork server loads it (and looks up what children call)
    before its first fork, so a child does not pay ctypes' load per use."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def expected_parent() -> int | None:
    value = os.environ.get("AGENTD_PARENT_PID", "")
    return int(value) if value.isdigit() else None


def _inherited_pidfd() -> int | None:
    value = os.environ.get(PARENT_PIDFD_ENV, "")
    return int(value) if value.isdigit() else None


def _has_exited(pidfd: int) -> bool:
    import select

    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def parent_pidfd() -> int | None:
    """A pidfd that becomes readable when our parent exits (Linux ≥ 5.3), else None; the caller closes it."""
    inherited = _inherited_pidfd()
    if inherited is not None:
        return os.dup(inherited)
    expected = expected_parent()
    if expected is None:
        return None
    try:
        fd = os.pidfd_open(expected)
    except (OSError, AttributeError):
        return None
    if os.getppid() != expected:  # it died (and we were reparented) before the pidfd was taken
        os.close(fd)
        return None
    return fd


async def wait_parent_gone() -> None:
    """Return when the process that started us has exited."""
    expected = expected_parent()
    if expected is None:  # not started by a supervisor (a test harness): nothing to watch
        await trio.sleep_forever()
    fd = parent_pidfd()
    if fd is not None:
        try:
            await trio.lowlevel.wait_readable(fd)
        finally:
            os.close(fd)
        return
    while os.getppid() == expected:  # noqa: ASYNC110 -- no pidfd: poll coarsely
        await trio.sleep(1.0)
