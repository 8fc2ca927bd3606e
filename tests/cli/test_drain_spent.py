"""A once run cut by the drain's end (SIGTERM, then ``--drain-timeout`` passes while a model call is still
in flight) prints a "cancelled" document with the steps and tokens it had really spent, not zeros."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import trio

from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call

pytestmark = pytest.mark.usefixtures("no_leftover_children")


async def test_a_run_cut_by_the_drain_reports_what_it_spent() -> None:
    hold = trio.Event()
    second = trio.Event()

    def reply(request: RecordedRequest) -> dict:
        if not any(m.get("role") == "tool" for m in request.messages):
            return {**tool_call("resource_read", {"uri": "file:///none"}),
                    "usage": {"prompt_tokens": 120, "completion_tokens": 30}}
        second.set()
        return text("never", wait=hold)  # in flight when the drain ends

    async with scripted_gateway(default=reply) as gw:
        argv = [sys.executable, "-m", "agentd", "--instruction", "work slowly", "--intelligence", gw.url,
                "--drain-timeout", "1"]
        proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        out = bytearray()
        try:
            async with trio.open_nursery() as nursery:
                async def read() -> None:
                    assert proc.stdout is not None
                    async for chunk in proc.stdout:
                        out.extend(chunk)

                nursery.start_soon(read)
                with trio.fail_after(60):
                    await second.wait()
                    proc.send_signal(signal.SIGTERM)
                    code = await proc.wait()
        finally:
            hold.set()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert code == 0  # a clean drain
    doc = json.loads(out.decode())  # one JSON document
    assert doc["status"] == "cancelled" and doc["done"] is True, doc  # it ended, as in every other end state
    assert doc["steps"] == 2, doc  # as the loop counts them: the second step began (its call was in flight)
    spent = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
    assert doc["usage"] == {**spent, "own": spent}, doc  # the held call never began to answer: nothing more
