"""Files agentd writes beside a run (the journal and its WAL, the health file, the report) are its own: 0600.

They hold instructions, tool results and the run's shape; a state directory made 0755 by someone else (or an
umask of 022) must not make them readable to every local user. ``open(path, "w")`` creates with ``0666 & ~umask``
and SQLite creates its ``-wal`` and ``-shm`` files with the main database file's mode, so the one rule is: create
every file 0600 before anything writes to it (``O_CREAT`` with mode 0600, then ``fchmod``, which no umask
narrows or widens), and tighten a file an older agentd left readable.
"""

from __future__ import annotations

import contextlib
import os
from typing import IO, Final

MODE: Final = 0o600
#: SQLite's companion files of a database in WAL mode.
SQLITE_COMPANIONS: Final = ("-wal", "-shm", "-journal")


def open_private(path: str, *, truncate: bool = True) -> IO[str]:
    """``path`` opened for writing text (UTF-8), created or tightened to 0600; not following a symlink."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if truncate else os.O_APPEND)
    fd = os.open(path, flags, MODE)
    try:
        os.fchmod(fd, MODE)
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def prepare_database(path: str) -> None:
    """Create the SQLite file ``path`` empty with mode 0600 unless it exists, and tighten it and its companion
    files to 0600 when they do (SQLite gives new companions the database file's mode)."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, MODE)
    try:
        os.fchmod(fd, MODE)
    finally:
        os.close(fd)
    for suffix in SQLITE_COMPANIONS:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path + suffix, MODE, follow_symlinks=False)
