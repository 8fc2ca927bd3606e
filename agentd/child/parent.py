"""How a child knows its parent is gone: it refuses to start orphaned and watches the parent that started it.

Used by every child session and by the fork server itself, so no process of a tree outlives the supervisor
that owns it (a pidfd where the kernel has one, ``PR_SET_PDEATHSIG`` in forked children, a coarse poll else).
"""

from __future__ import annotations

import os
import signal

import trio

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Refuse to start orphaned; in a forked child, also ask the kernel for SIGKILL when the parent dies.

    ``PR_SET_PDEATHSIG`` fires when the parent *thread* exits. trio starts processes from a worker thread
    of its thread cache, which exits after idling, so the signal is armed only when the parent is the
    single-threaded fork server (``AGENTD_FORKED=1``). Every child also watches its parent (see
    :func:`wait_parent_gone`), which covers both cases.
    """
    if os.environ.get("AGENTD_FORKED") == "1":
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    expected = expected_parent()
    if expected is not None and os.getppid() != expected:
        os._exit(1)  # the parent died before we got here


def expected_parent() -> int | None:
    value = os.environ.get("AGENTD_PARENT_PID", "")
    return int(value) if value.isdigit() else None


def parent_pidfd() -> int | None:
    """A pidfd that becomes readable when our parent exits (Linux ≥ 5.3), else None."""
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
