"""A serving daemon's descriptors: served spawns that ended hold none, and a spawn the daemon has no
descriptors for is a clean, retryable ``isError`` refusal (with its event), never a traceback.

A real worker agentd (``--serve-mcp`` on loopback, children forked from its fork server) is driven with
agentd's own MCP client; its descriptors are counted in ``/proc/<pid>/fd``.
"""

from __future__ import annotations

import os
import resource

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.integration.agents import agentd_worker, text_of
from tests.peers.gateway import scripted_gateway, text

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]


def fds_of(pid: int) -> list[int]:
    return sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))


def lowest_free(fds: list[int]) -> int:
    taken = set(fds)
    return next(n for n in range(len(fds) + 1) if n not in taken)


async def test_served_spawns_release_their_descriptors_and_emfile_is_a_clean_refusal() -> None:
    async with scripted_gateway(default=lambda request: text("done")) as gw:
        # Nine spawns in a few seconds: above the default spawn-rate burst (8, refilled at 2/s), which a fast
        # machine reaches before the bucket refills. The rate limit is not what this test is about.
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url, "--spawn-burst", "32"]
        async with agentd_worker(argv) as worker:
            server = McpServerConfig(name="worker", url=worker.url)
            log = EventLog(sink=lambda line: None)
            with trio.fail_after(120):
                async with open_mcp_pool([server], log=log, secrets=SecretResolver(env={}), run_id="t") as pool:

                    async def spawn() -> object:
                        return await pool.call_tool("worker", "subagent.spawn", {"instruction": "task"})

                    first = await spawn()
                    assert first.is_error is False  # the fork server is up, the client's connection open
                    baseline = fds_of(worker.pid)
                    for _ in range(6):
                        done = await spawn()
                        assert done.is_error is False and done.structured["status"] == "completed", done
                    assert fds_of(worker.pid) == baseline

                    # No descriptor left for the daemon: the spawn is refused, retryably, as a tool result.
                    soft, hard = resource.prlimit(worker.pid, resource.RLIMIT_NOFILE)
                    resource.prlimit(worker.pid, resource.RLIMIT_NOFILE, (lowest_free(baseline), hard))
                    try:
                        refused = await spawn()
                    finally:
                        resource.prlimit(worker.pid, resource.RLIMIT_NOFILE, (soft, hard))
                    assert refused.is_error is True, refused
                    assert "Too many open files" in text_of(refused.content)
                    assert refused.structured["refused"] == "resources"
                    assert refused.structured["retryable"] is True
                    assert fds_of(worker.pid) == baseline
                    again = await spawn()
                    assert again.is_error is False and again.structured["status"] == "completed"
        assert worker.returncode == 0
    assert [e["cap"] for e in worker.named("subagent.refused")] == ["resources"]
    assert not worker.named("non-json"), worker.named("non-json")[:5]  # no raw traceback on stderr
