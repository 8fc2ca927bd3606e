"""Descendant processes of this test process, read from ``/proc`` (Linux), to catch leaked children."""

from __future__ import annotations

import os
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


def leftovers(
    before: dict[int, ProcInfo], *, grace: float = 2.0, ignore: frozenset[int] = frozenset()
) -> list[ProcInfo]:
    """Descendants (live or zombie) that did not exist in ``before``, after waiting up to ``grace`` seconds.

    ``ignore`` holds pids of long-lived processes (session-scoped peers) that may legitimately start during a
    test; they and their own descendants are not leftovers. Real wall-clock polling: child exit is real time even
    when the test ran on a mock clock.
    """
    deadline = time.monotonic() + grace
    while True:
        now = descendants()
        skip = set(ignore)
        for pid in ignore:
            skip.update(descendants(pid))
        new = [p for pid, p in now.items() if pid not in before and pid not in skip]
        if not new or time.monotonic() >= deadline:
            return new
        time.sleep(0.05)
