"""Run ``python -m agentd`` as a real process and read its one stdout document and stderr event lines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import attrs


@attrs.frozen
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stderr.splitlines() if line.strip()]

    @property
    def document(self) -> Any:
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, f"stdout must hold exactly one JSON document, got {self.stdout!r}"
        return json.loads(lines[0])


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's environment minus any AGENT_/AGENTD_ settings that would leak into the run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "AGENTD_"))}
    env.update(extra or {})
    return env


def run_agentd(args: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
               timeout: float = 60.0, python_flags: Sequence[str] = ()) -> Outcome:
    proc = subprocess.run(
        [sys.executable, *python_flags, "-m", "agentd", *args],
        env=clean_env(env), cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
    )
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


@contextmanager
def tripwire() -> Iterator[socket.socket]:
    """A listening loopback socket: anything that connects to it shows up in the accept backlog."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def assert_untouched(sock: socket.socket) -> None:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return
    conn.close()
    raise AssertionError("agentd opened a connection before rejecting its configuration")
