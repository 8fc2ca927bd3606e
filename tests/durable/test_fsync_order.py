"""A step that asks for tool calls is on the disk (the journal's WAL fsynced) before any of its calls is sent.

What a power loss would test, observed directly: agentd runs under ``strace``, which writes each write and
each sync of a file descriptor to its log as the system call returns (before the process goes on). The
counting peer reads that log at the moment the call arrives. The model's reply carries a marker in the
call's arguments, so the WAL frames holding the reply are the ``pwrite64`` calls on ``journal.sqlite3-wal``
whose data contains it: a completed ``fdatasync``/``fsync`` of the WAL must follow the last of them in what
the log held when the call arrived. A reply committed without that sync (``synchronous=NORMAL``, the commit
most records now use) fails this test: nothing else syncs the WAL between the reply and the call.

Real parts: agentd as a process (traced), the scripted gateway, the counting MCP peer over HTTP. Skipped
where ``strace`` is missing or tracing is not permitted (no ptrace in the container).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.durable.peer import counting_peer
from tests.durable.test_crash_resume import _argv, _kinds, _rules, _run
from tests.peers.gateway import scripted_gateway, tool_call

MARKER = "fsync-marker-7d1c9a"
WAL = "journal.sqlite3-wal>"
SYNCS = ("fdatasync(", "fsync(")


def _strace() -> str:
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    probe = subprocess.run([strace, "-f", "-qq", "-o", "/dev/null", "true"], capture_output=True, timeout=30,
                           check=False)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.decode(errors='replace')[-300:]}")
    return strace


def _synced_after(lines: list[str], index: int) -> bool:
    """A sync of the WAL that started after line ``index`` and completed within ``lines``."""
    for i in range(index + 1, len(lines)):
        line = lines[i]
        if WAL not in line or not any(s in line for s in SYNCS):
            continue
        if "<unfinished ...>" not in line:
            return line.rstrip().endswith("= 0")
        pid = line.split(" ", 1)[0]
        return any(later.startswith(f"{pid} <... f") and "sync resumed>" in later and later.rstrip().endswith("= 0")
                   for later in lines[i + 1:])
    return False


def test_the_sync_check_reads_a_trace_as_intended() -> None:
    wal = "3</s/journal.sqlite3-wal>"
    write = f'7 pwrite64({wal}, "..{MARKER}..", 4096, 32) = 4096'
    assert _synced_after([write, f"7 fdatasync({wal}) = 0"], 0)
    assert _synced_after([write, f"7 fdatasync({wal} <unfinished ...>", "8 pwrite64(...)", "7 <... fdatasync resumed>) = 0"], 0)
    assert not _synced_after([write], 0)
    assert not _synced_after([f"7 fdatasync({wal}) = 0", write], 1)
    assert not _synced_after([write, f"7 fdatasync({wal} <unfinished ...>"], 0)
    assert not _synced_after([write, "7 fdatasync(4</s/journal.sqlite3>) = 0"], 0)


async def test_a_reply_with_tool_calls_is_synced_to_the_disk_before_its_call_reaches_the_server(tmp_path: Path) -> None:
    strace = _strace()
    state, log = tmp_path / "state", tmp_path / "strace.log"
    seen: dict[str, str] = {}

    def on_call(call: dict[str, Any]) -> None:
        if call.get("key") == MARKER and "trace" not in seen:
            seen["trace"] = log.read_text(errors="replace")

    async with counting_peer(on_call=on_call) as peer, scripted_gateway(
        rules=_rules(None), default=tool_call("pay__charge", {"key": MARKER}),
    ) as gw:
        traced = [strace, "-f", "-qq", "-y", "-s", "65536", "-e", "trace=pwrite64,fdatasync,fsync", "-o", str(log),
                  *_argv(gw, peer, state)]
        code, result, stderr = await _run(traced)
    assert code == 0, stderr[-3000:]
    assert result["status"] == "completed" and peer.count("charge") == 1
    assert "trace" in seen
    lines = seen["trace"].splitlines()
    written = [i for i, line in enumerate(lines) if "pwrite64(" in line and WAL in line and MARKER in line]
    assert written, "the reply was not in the journal's WAL when its call arrived"
    assert _synced_after(lines, written[-1]), "the reply's WAL frames were not synced before its call was sent"
    kinds = _kinds(state)
    assert kinds[0] == "run.started" and kinds[-1] == "run.ended" and "tool.requested" in kinds
