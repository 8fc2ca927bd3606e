"""Run ``python -m agentd`` with its stderr (and optionally stdout) on a real pseudo-terminal, the way a person
runs it, and read what the terminal received."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Mapping, Sequence

from tests.cli.helpers import clean_env

CONTROL = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07]*\x07|\x1b[=>()][0-9A-B]?|[\r\n]")


def plain(raw: str) -> str:
    """The screen a person sees, as text: a small terminal model (lines, a cursor, erase and cursor-up, which is
    what a redrawn status line uses), so a line that was drawn and then erased is not there."""
    lines: list[list[str]] = [[]]
    row = col = 0
    pos = 0

    def put(text: str) -> None:
        nonlocal col
        line = lines[row]
        for char in text:
            if col < len(line):
                line[col] = char
            else:
                line.extend(" " * (col - len(line)))
                line.append(char)
            col += 1

    for match in CONTROL.finditer(raw):
        put(raw[pos:match.start()])
        pos = match.end()
        token = match.group(0)
        if token == "\r":
            col = 0
        elif token == "\n":
            row += 1
            col = 0
            while len(lines) <= row:
                lines.append([])
        elif match.group(2) == "A":
            row = max(row - int(match.group(1) or 1), 0)
        elif match.group(2) == "B":
            row += int(match.group(1) or 1)
            while len(lines) <= row:
                lines.append([])
        elif match.group(2) == "K":
            mode = match.group(1)
            lines[row] = [] if mode == "2" else lines[row][:col]
    put(raw[pos:])
    return "\n".join("".join(line).rstrip() for line in lines)


class PtyRun:
    """One agentd process: stdin and stderr on a pty (stdout too with ``stdout_tty``), stdout otherwise a pipe."""

    def __init__(self, args: Sequence[str], *, env: Mapping[str, str] | None = None, stdout_tty: bool = False,
                 cwd: str | None = None) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
        full_env = clean_env({"TERM": "xterm-256color", "COLUMNS": "160", "LINES": "50", **(env or {})})
        if "NO_COLOR" not in (env or {}):
            full_env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentd", *args], stdin=slave, stderr=slave,
            stdout=slave if stdout_tty else subprocess.PIPE, env=full_env, cwd=cwd, start_new_session=True)
        os.close(slave)
        self.raw = b""

    @property
    def text(self) -> str:
        return self.raw.decode("utf-8", "replace")

    def _pump(self, wait: float) -> bool:
        """Read what is there within ``wait`` seconds; False once the terminal is closed (EOF)."""
        ready, _, _ = select.select([self.master], [], [], wait)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every writer closed its end
            return False
        self.raw += chunk
        return bool(chunk)

    def read_until(self, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while needle not in plain(self.text):
            if time.monotonic() > deadline or not self._pump(0.1):
                raise AssertionError(f"{needle!r} never appeared on the terminal:\n{plain(self.text)[-3000:]}")
        return plain(self.text)

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 60.0) -> tuple[int, str, str]:
        """Wait for the exit; (exit code, the terminal's text as a person reads it, stdout if it was a pipe)."""
        deadline = time.monotonic() + timeout
        try:
            while self._pump(0.1):
                if time.monotonic() > deadline:
                    raise AssertionError(f"agentd did not finish:\n{plain(self.text)[-3000:]}")
                if self.proc.poll() is not None and not select.select([self.master], [], [], 0.2)[0]:
                    break
            stdout = self.proc.stdout.read().decode() if self.proc.stdout else ""
            return self.proc.wait(timeout=max(deadline - time.monotonic(), 1)), plain(self.text), stdout
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()
            os.close(self.master)


def run_in_pty(args: Sequence[str], **options: object) -> tuple[int, str, str]:
    return PtyRun(args, **options).finish()  # type: ignore[arg-type]
