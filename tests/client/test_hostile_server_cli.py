"""A hostile MCP server (tests/peers/hostile.py) against the real CLI: every abuse ends in a clear exit code
with one JSON document on stdout, no traceback, a bounded peak RSS, and no hang past the deadline.

``agentd --instruction ... --intelligence test --mcp s=URL --deadline 5s`` runs as a child of
``tests.peers.maxrss`` (which records its peak RSS); the server runs in the test's own trio run on loopback.
tests/client/test_bad_peers.py covers the same ground in-process against the client library; this file
proves the bounds hold for the whole program.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from agentd.errors import ExitCode
from tests.client.fakeserver import serve_fake
from tests.peers.hostile import BEHAVIOURS

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 5.0
#: Python start-up, connecting and the drain after the deadline, on a loaded 2-core machine.
SLACK = 10.0
#: Peak RSS bound for one agentd run, in MiB: several times a normal run, far below what any of these
#: servers would make an unbounded client hold (they send without end, or 100k tools / 10 MB strings).
MAX_RSS_MIB = 400


@attrs.frozen
class Run:
    returncode: int
    stdout: bytes
    stderr: bytes
    seconds: float
    max_rss_mib: float

    def document(self) -> dict[str, Any]:
        """stdout is exactly one JSON document (an object), as the CLI promises."""
        text = self.stdout.decode("utf-8")
        doc = json.loads(text)
        assert isinstance(doc, dict), text[:500]
        return doc


async def run_against(behaviour: str, tmp_path: Path, *extra: str) -> Run:
    rss_file = tmp_path / "maxrss"
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, BEHAVIOURS[behaviour])
        argv = [sys.executable, "-m", "tests.peers.maxrss", str(rss_file), sys.executable, "-m", "agentd",
                "--instruction", "use the tools", "--intelligence", "test", "--mcp", f"s={fake.url}",
                "--deadline", f"{DEADLINE:g}s", *extra]
        started = time.monotonic()
        with trio.fail_after(DEADLINE + SLACK + 20):  # a hang fails here, the child is killed with the wrapper
            proc = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, cwd=ROOT,
                                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
        seconds = time.monotonic() - started
        nursery.cancel_scope.cancel()
    return Run(proc.returncode, proc.stdout, proc.stderr, seconds, int(rss_file.read_text()) / 1024)


#: Python start-up and exit are outside the bound: it is measured from ``run.start`` to ``proc.exit``.
END_SLACK = 3.0
#: behaviour -> the exit code it must end in.
EXPECTED = {
    # the handshake fails: the required server is unusable
    "garbage": ExitCode.MCP_REQUIRED,
    "deep_json": ExitCode.MCP_REQUIRED,
    "malformed_tools": ExitCode.MCP_REQUIRED,
    # a broken tool call is a tool error the model sees; the run itself completes
    "garbage_sse": ExitCode.OK,
    "endless_line": ExitCode.OK,
    "huge_body": ExitCode.OK,
    "huge_declared": ExitCode.OK,
    # bad schemas are dropped or carried; the run completes
    "invalid_schemas": ExitCode.OK,
    "get_flood": ExitCode.OK,
    # 10 MB descriptions are offered to the model: the token budget ends the run
    "huge_descriptions": ExitCode.BUDGET,
    # a call that never answers, a catalogue that never comes or is too big to take in: the deadline
    "endless_sse": ExitCode.BUDGET,
    "notification_flood": ExitCode.BUDGET,
    "stall_list": ExitCode.BUDGET,
    "endless_paging": ExitCode.BUDGET,
    "many_tools": ExitCode.BUDGET,
}
KNOWN: dict[str, Any] = {}


def _events(stderr: bytes) -> list[dict[str, Any]]:
    out = []
    for line in stderr.decode(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def _seconds(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def check_bounds(run: Run) -> dict[str, Any]:
    """One JSON document, no traceback, peak RSS under the bound, ended within the deadline (and a hard
    bound on the whole process, start-up included)."""
    detail = run.stderr.decode(errors="replace")[-3000:]
    assert "Traceback" not in run.stderr.decode(errors="replace"), detail
    assert run.max_rss_mib <= MAX_RSS_MIB, (run.max_rss_mib, detail)
    assert run.seconds <= DEADLINE + SLACK + 15, (run.seconds, detail)
    events = _events(run.stderr)
    start = next(e["ts"] for e in events if e.get("event") == "run.start")
    end = next(e["ts"] for e in events if e.get("event") == "proc.exit")
    assert _seconds(end) - _seconds(start) <= DEADLINE + END_SLACK, (start, end, detail)
    return run.document()


def test_every_behaviour_has_an_expectation() -> None:
    assert set(EXPECTED) == set(BEHAVIOURS)


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_children")
@pytest.mark.parametrize("behaviour", [pytest.param(b, marks=KNOWN.get(b, ())) for b in sorted(EXPECTED)])
async def test_hostile_server_is_survived_within_bounds(behaviour: str, tmp_path: Path) -> None:
    run = await run_against(behaviour, tmp_path)
    doc = check_bounds(run)
    assert run.returncode == EXPECTED[behaviour], (run.returncode, doc, run.stderr.decode(errors="replace")[-3000:])
