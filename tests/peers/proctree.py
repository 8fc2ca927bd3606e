"""Descendant processes of this test process, read from ``/proc`` (Linux), to catch leaked children."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from pathlib import Path

import attrs


@attrs.frozen
class ProcInfo:
    pid: int
    ppid: int
    state: str
    cmdline: str

    @property
    def zombie(self) -> bool:
        return self.state == "Z"


def _read(pid: int) -> ProcInfo | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    rest = stat[stat.rindex(")") + 2 :].split()
    cmd = raw.replace(b"\0", b" ").decode(errors="replace").strip() or stat[stat.index("(") + 1 : stat.rindex(")")]
    return ProcInfo(pid=pid, ppid=int(rest[1]), state=rest[0], cmdline=cmd)


def all_processes() -> dict[int, ProcInfo]:
    out: dict[int, ProcInfo] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (info := _read(int(entry))) is not None:
            out[info.pid] = info
    return out


def descendants(root: int | None = None) -> dict[int, ProcInfo]:
    """Every process whose parent chain reaches ``root`` (default: this process), excluding ``root``."""
    root = os.getpid() if root is None else root
    procs = all_processes()
    children: dict[int, list[int]] = {}
    for info in procs.values():
        children.setdefault(info.ppid, []).append(info.pid)
    out: dict[int, ProcInfo] = {}
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out[pid] = procs[pid]
        stack.extend(children.get(pid, ()))
    return out


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``).

    Without it, a grandchild whose parent died is reparented to pid 1 and no longer looks like ours, so a leak
    behind a killed parent (a subagent outliving a SIGKILLed daemon) would pass unseen.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def _reap_adopted(before: dict[int, ProcInfo], ignore: frozenset[int]) -> None:
    """Reap zombies that are new children of ours: orphans adopted as a subreaper, which nobody else waits for.

    (A test's own unwaited ``Popen`` is already reported by Python's ResourceWarning, an error here.)
    """
    me = os.getpid()
    for info in descendants().values():
        if info.ppid == me and info.zombie and info.pid not in before and info.pid not in ignore:
            try:
                os.waitpid(info.pid, os.WNOHANG)
            except ChildProcessError:
                pass


def leftovers(
    before: dict[int, ProcInfo], *, grace: float = 2.0, ignore: frozenset[int] = frozenset(),
    reap_adopted: bool = False,
) -> list[ProcInfo]:
    """Descendants (live or zombie) that did not exist in ``before``, after waiting up to ``grace`` seconds.

    ``ignore`` holds pids of long-lived processes (session-scoped peers) that may legitimately start during a
    test; they and their own descendants are not leftovers. ``reap_adopted`` first reaps exited orphans this
    process adopted (see :func:`become_subreaper`), so only live ones count. Real wall-clock polling: child exit is real time even
    when the test ran on a mock clock.
    """
    deadline = time.monotonic() + grace
    while True:
        if reap_adopted:
            _reap_adopted(before, ignore)
        now = descendants()
        skip = set(ignore)
        for pid in ignore:
            skip.update(descendants(pid))
        new = [p for pid, p in now.items() if pid not in before and pid not in skip]
        if not new or time.monotonic() >= deadline:
            return new
        time.sleep(0.05)  # real time: processes exit in real time, even when the test ran on a mock clock
