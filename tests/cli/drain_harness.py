"""A program for the drain tests: the CLI's signal/drain wrapper around a stand-in daemon ``main``.

The thing under test is ``agentd.cli._trio_run_with_drain`` (real signals, a real process); the stand-in
daemon only decides how it reacts to the drain latch: ``honour`` returns when the latch is set, ``ignore``
keeps running until cancelled.
"""

from __future__ import annotations

import json
import sys

import attrs
import trio

from agentd.cli import _trio_run_with_drain
from agentd.config import Config
from agentd.config.load import load_config
from agentd.oversight.drain import current_drain
from agentd.telemetry.events import EventLog


@attrs.frozen
class Result:
    exit_code: int
    how: str


async def daemon(config: Config, *, log: EventLog | None = None) -> Result:
    del log  # agentd.daemon.main's signature: the CLI hands it the root log
    behaviour = sys.argv[1]
    latch = current_drain()
    print("ready", flush=True)
    if behaviour == "honour":
        await latch.wait()
        return Result(0, f"drained:{latch.reason}")
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def main() -> None:
    config = load_config(["--instruction", "x", "--intelligence", "test", "--drain-timeout", sys.argv[2]],
                              env={})
    outcome = _trio_run_with_drain(daemon, config, EventLog(level="debug"))
    result = outcome.result
    print(json.dumps({"result": None if result is None else result.how, "forced": outcome.forced,
                      "drained": outcome.drained}), flush=True)


if __name__ == "__main__":
    main()
