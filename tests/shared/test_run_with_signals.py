"""``agentd.oversight.drain.run_with_signals``: the one signal-to-drain runner ``agentd`` and ``agentd run`` share.

Real signals to this process (trio's signal receiver turns them into drain / force); no clocks are mocked
where a real signal must arrive, and every wait is bounded.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import trio

from agentd.oversight.drain import current_drain, installed_drain, run_with_signals
from agentd.telemetry.events import EventLog


def _log(lines: list[dict[str, Any]] | None = None) -> EventLog:
    return EventLog(sink=(lines.append if lines is not None else lambda line: None))


async def test_first_signal_drains_and_the_run_finishes_its_work() -> None:
    async def main() -> str:
        assert installed_drain() is not None
        os.kill(os.getpid(), signal.SIGTERM)
        await current_drain().wait()
        return "finished"

    with trio.fail_after(10):
        run = await run_with_signals(main, drain_timeout=30.0, log=_log())
    assert (run.result, run.drained, run.forced) == ("finished", True, False)
    assert installed_drain() is None


async def test_second_signal_forces_the_run_to_end_at_once() -> None:
    async def main() -> str:
        os.kill(os.getpid(), signal.SIGINT)
        await current_drain().wait()
        os.kill(os.getpid(), signal.SIGINT)
        await trio.sleep_forever()
        return "unreachable"

    with trio.fail_after(10):
        run = await run_with_signals(main, drain_timeout=3600.0, log=_log())
    assert (run.result, run.drained, run.forced) == (None, True, True)


async def test_drain_timeout_cancels_work_that_does_not_finish() -> None:
    async def main() -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        await trio.sleep_forever()
        return "unreachable"

    lines: list[dict[str, Any]] = []
    with trio.fail_after(10):
        run = await run_with_signals(main, drain_timeout=0.2, log=_log(lines))
    assert (run.result, run.drained, run.forced) == (None, True, False)
    events = [(line["event"], line.get("action") or line.get("outcome")) for line in lines]
    assert events == [("proc.signal", "drain"), ("drain.end", "cancelled")]


async def test_without_a_signal_the_result_passes_through() -> None:
    async def main() -> int:
        return 7

    run = await run_with_signals(main, drain_timeout=1.0, log=_log())
    assert (run.result, run.drained, run.forced) == (7, False, False)
