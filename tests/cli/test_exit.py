"""``agentd.cli.exit_now``: the CLI's exit skips the interpreter's module teardown, never what an exit owes.

Real subprocesses: the exit code, buffered stdout and stderr, and ``atexit`` callbacks all survive the fast
path; with another thread alive the ordinary exit is taken (the thread's output is not cut off).
"""

from __future__ import annotations

import subprocess
import sys

_PROGRAM = """
import atexit, sys
from agentd.cli import exit_now
atexit.register(lambda: sys.stdout.write("atexit ran\\n"))
sys.stdout.write("buffered, no newline")
sys.stderr.write("err line")
{extra}
exit_now(3)
"""


def _run(extra: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _PROGRAM.format(extra=extra)], capture_output=True, text=True,
                          timeout=60, check=False, stdin=subprocess.DEVNULL)


def test_fast_exit_keeps_the_code_the_output_and_the_atexit_callbacks() -> None:
    proc = _run()
    assert proc.returncode == 3
    assert proc.stdout == "buffered, no newlineatexit ran\n"
    assert proc.stderr == "err line"


def test_with_another_thread_alive_the_ordinary_exit_waits_for_it() -> None:
    extra = ("import time\n"
             "def late():\n    time.sleep(0.3)\n    sys.stdout.write(' late')\n"
             "import threading\nthreading.Thread(target=late).start()")
    proc = _run(extra)
    assert proc.returncode == 3
    assert proc.stdout.startswith("buffered, no newline") and " late" in proc.stdout
    assert "atexit ran" in proc.stdout
