"""Run a command and record its peak RSS: ``python -m tests.peers.maxrss OUT_FILE CMD...``.

stdin/stdout/stderr are the command's own; the exit status is passed on (a signal as 128+N). The peak
resident set size of the command (``ru_maxrss`` of this process's only child, in KiB) is written to OUT_FILE.
The command dies with this wrapper (``PR_SET_PDEATHSIG``), so a test that kills the wrapper on a timeout
leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import resource
import signal
import subprocess
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def main() -> None:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    code = subprocess.call(argv, preexec_fn=_die_with_parent)
    out.write_text(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
