"""The event poll loop (agentd.client.events.EventPoller) against a scripted server function, on trio's autojump
clock: it waits the server's nextPollMs (kept within the floor and the cap), drains a backlog at once, carries
the cursor forward, and backs off on failures without losing its place."""

from __future__ import annotations

from typing import Any

import trio

from agentd.client.events import EventPoller
from agentd.errors import McpTransportError
from agentd.mcp import events


def occ(i: int) -> dict[str, Any]:
    return {"eventId": f"e{i}", "name": "t", "timestamp": "2026-12-07T00:00:00Z", "data": {"i": i}}


async def test_polls_follow_next_poll_ms_and_carry_the_cursor(autojump_clock: trio.abc.Clock) -> None:
    answers: list[Any] = [
        {"events": [], "cursor": "c0", "nextPollMs": 5000},
        {"events": [occ(1)], "cursor": "c1", "hasMore": True, "nextPollMs": 5000},
        {"events": [occ(2)], "cursor": "c2", "nextPollMs": 10},  # below the floor: 1 s
        McpTransportError("down", server="s"),
        McpTransportError("down", server="s"),
        {"events": [], "cursor": "c3", "nextPollMs": 600_000},  # above the cap
        {"events": [], "cursor": "c3"},
    ]
    seen: list[tuple[float, Any]] = []
    batches: list[events.PollResult] = []
    start = trio.current_time()

    async def request(method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert method == "events/poll" and params["name"] == "t" and params["arguments"] == {"q": 1}
        seen.append((round(trio.current_time() - start, 3), params["cursor"]))
        answer = answers.pop(0) if answers else {"events": [], "cursor": "c3"}
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    async def on_batch(result: events.PollResult) -> None:
        batches.append(result)

    poller = EventPoller(request, "s", "t", {"q": 1}, on_batch, poll_floor=1.0, poll_cap=60.0, retry=1.0)
    with trio.move_on_after(200):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poller.run)
            while answers:
                await trio.sleep(1)
            await trio.sleep(120)
            nursery.cancel_scope.cancel()
    assert seen[:7] == [(0.0, None), (5.0, "c0"), (5.0, "c1"), (6.0, "c2"), (7.0, "c2"), (9.0, "c2"), (69.0, "c3")]
    assert [len(b.events) for b in batches[:5]] == [0, 1, 1, 0, 0]
    assert poller.cursor == "c3"


async def test_a_malformed_answer_keeps_the_cursor(autojump_clock: trio.abc.Clock) -> None:
    answers: list[dict[str, Any]] = [{"events": [], "cursor": "c0"}, {"events": [], "cursor": 7},
                                     {"events": [occ(1)], "cursor": "c1"}]
    cursors: list[Any] = []

    async def request(method: str, params: dict[str, Any]) -> dict[str, Any]:
        cursors.append(params["cursor"])
        return answers.pop(0) if answers else {"events": [], "cursor": "c1"}

    async def on_batch(result: events.PollResult) -> None:
        pass

    poller = EventPoller(request, "s", "t", {}, on_batch)
    with trio.move_on_after(30):
        await poller.run()
    assert cursors[:3] == [None, "c0", "c0"]  # the garbage answer did not move it
    assert poller.cursor == "c1"
