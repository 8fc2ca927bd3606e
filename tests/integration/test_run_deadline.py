"""``--deadline`` bounds the whole run, connecting to the MCP servers included.

A real ``agentd`` process is pointed at a loopback server that accepts TCP connections and never answers
(the pool's own connect timeouts are far longer than the deadline): the run must end at its deadline with
the documented status and exit code, and one JSON document on stdout.
"""

from __future__ import annotations

import datetime
import functools
import json

import pytest
import trio

from agentd.defaults import CONNECT_TIMEOUT
from tests.integration.agents import run_agentd

pytestmark = pytest.mark.slow


async def _accept_and_never_answer(stream: trio.SocketStream) -> None:
    async with stream:
        await trio.sleep_forever()


async def test_deadline_covers_connecting_to_a_server_that_never_answers() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, _accept_and_never_answer, 0,
                                                          host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        done = await run_agentd(["--intelligence", "test", "--instruction", "hello", "--deadline", "1s",
                                 "--mcp", f"stuck=http://127.0.0.1:{port}/mcp"], timeout=60)
        nursery.cancel_scope.cancel()
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    assert result["status"] == "deadline", (result, done.stderr.decode()[-2000:])
    assert done.returncode == 7 and result["partial"] is True and result["result"] is None
    events = [json.loads(line) for line in done.stderr.decode().splitlines() if line.startswith("{")]
    assert any(e.get("event") == "loop.budget" and e.get("budget") == "deadline" for e in events)
    # The 1 s deadline ended it, not the pool's connect timeout: by the daemon's own clock (its events, from the
    # configuration loaded, before any connecting, to the run's end), the interpreter's start left out.
    [loaded] = [_ts(e) for e in events if e.get("event") == "config.loaded"]
    [ended] = [_ts(e) for e in events if e.get("event") == "run.end"]
    assert ended - loaded < CONNECT_TIMEOUT, ended - loaded


def _ts(event: dict[str, object]) -> float:
    return datetime.datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()
