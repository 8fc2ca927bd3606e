"""Where an event subscription resumes after a restart (agentd.modes.events.EventRoute, a real SQLite journal, a
real agentd MCP pool and the events-extension peer): a wake journaled as carrying occurrences resumes after them
only when its run began (the daemon resumes that run); a wake whose run never began is replayed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import EventSubscriptionConfig, McpServerConfig
from agentd.journal.records import RunStarted
from agentd.journal.sqlite import open_journal
from agentd.modes.events import EVENT_CURSORS, EventRoute
from agentd.telemetry.events import null_log
from tests.modes.events_peer import emit, side
from tests.peers import launch
from tests.waiting import until

pytestmark = pytest.mark.interop

SUB = EventSubscriptionConfig("ev", "ticket.created")
KEY = "event:ev/ticket.created"


@pytest.mark.parametrize(("began", "resumes_at"), [(False, "c1"), (True, "c3")])
async def test_a_pending_wake_decides_where_polling_resumes(tmp_path: Path, began: bool, resumes_at: str) -> None:
    async with launch.peer_server(launch.events_server_argv()) as peer:
        await emit(peer.url, {"title": "before"}, count=3)
        async with open_journal(str(tmp_path)) as journal:
            await journal.put_state(EVENT_CURSORS, {KEY: {"cursor": "c1", "pending": {"run": "d.4", "cursor": "c3"}}})
            if began:
                await journal.append("d.4", [RunStarted("digest", "the wake's prompt")])
            notified: list[str] = []
            async with open_mcp_pool([McpServerConfig("ev", peer.url)], log=null_log()) as pool:
                route = EventRoute(pool, lambda key, server: notified.append(key), state=journal)
                async with trio.open_nursery() as nursery:
                    await route.arm([SUB], nursery)
                    async def polled() -> Any:
                        return (await side(peer.url, "/_test/events"))["polls"]

                    await until(polled, timeout=30, what="the first poll")
                    await until(lambda: began or notified, timeout=30, what="the pending wake notified")
                    nursery.cancel_scope.cancel()
        first = (await side(peer.url, "/_test/events"))["polls"][0]
        assert first["cursor"] == resumes_at
        if not began:  # the occurrences after c1 were never woken on: they are pending for a wake now
            taken = route.take(KEY)
            assert taken is not None and [o.event_id for o in taken.occurrences] == ["evt-1", "evt-2"]
            assert taken.cursor == "c3"
