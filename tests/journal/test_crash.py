"""SIGKILL mid-write: a real process appends steps as fast as it can and is killed; the journal reopens
readable, every committed batch whole, and appending continues where it stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import trio

from agentd.journal.cli import journal_main
from agentd.journal.records import RunStarted, Usage
from agentd.journal.sqlite import DB_NAME, JournalFile, open_journal
from tests.journal.helpers import step
from tests.waiting import until

WRITER = """
import sys, trio
from agentd.journal.records import RunStarted
from agentd.journal.sqlite import open_journal
from tests.journal.helpers import step

async def main(state_dir):
    async with open_journal(state_dir) as journal:
        for run in range(3):
            await journal.append(f"r{run}", [RunStarted("d", "go")])
        n = 0
        while True:
            for run in range(3):
                await journal.append(f"r{run}", step(n), durable=n % 7 == 0)
            await journal.put_state("progress", {"n": n, "blob": "x" * 2000})
            n += 1

trio.run(main, sys.argv[1])
"""


async def _committed_steps(path: str) -> int:
    def count() -> int:
        try:
            journal = JournalFile(path, readonly=True)
        except Exception:
            return 0
        try:
            summary, _ = journal.read_raw("r2")
            return 0 if summary is None else (summary.records - 1) // 4
        finally:
            journal.close()

    return await trio.to_thread.run_sync(count)


async def test_sigkill_mid_write_leaves_a_readable_journal(tmp_path, capsys):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    proc = await trio.lowlevel.open_process([sys.executable, str(script), str(tmp_path)], cwd=root,
                                            env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"})
    try:
        async def enough() -> bool:
            assert proc.poll() is None, "the writer died on its own"
            return await _committed_steps(str(tmp_path / DB_NAME)) >= 200

        await until(enough, timeout=60, what="200 committed steps")
    finally:
        proc.send_signal(signal.SIGKILL)
        with trio.fail_after(10):
            await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    async with open_journal(str(tmp_path)) as journal:
        runs = {}
        for run_id in ("r0", "r1", "r2"):
            run = await journal.read_run(run_id)
            assert run is not None and run.summary.status == "running"
            assert [e.seq for e in run.entries] == list(range(len(run.entries)))
            assert run.entries[0].record == RunStarted("d", "go")
            body = [e.record for e in run.entries[1:]]
            assert len(body) % 4 == 0, "a batch was committed in part"
            for n in range(len(body) // 4):
                assert body[4 * n : 4 * n + 4] == step(n)
            runs[run_id] = len(body) // 4
        # steps go r0, r1, r2 in turn, so the runs differ by at most one step, r0 ahead
        assert runs["r0"] >= runs["r1"] >= runs["r2"] >= runs["r0"] - 1 and runs["r2"] >= 200
        progress = await journal.get_state("progress")
        assert progress["n"] in (runs["r2"] - 2, runs["r2"] - 1)  # written after each round of steps
        assert sorted(s.run_id for s in await journal.unfinished_runs()) == ["r0", "r1", "r2"]
        # the journal takes new batches after the crash
        last = await journal.append("r2", [Usage(10_000, 1, 1)])
        assert last == 4 * runs["r2"] + 1
    assert journal_main(["export", "r2", "--state-dir", str(tmp_path)], {}) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["records"][-1]["kind"] == "usage" and len(doc["records"]) == last + 1


def test_the_writer_script_stays_importable():
    # guard the subprocess against silently failing on an import (it would then never reach 200 steps)
    out = subprocess.run([sys.executable, "-c", "import tests.journal.helpers, agentd.journal.sqlite"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
