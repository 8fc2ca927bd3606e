"""MCP event cursors survive a SIGKILL (real agentd processes, the events-extension peer, the scripted gateway):
the events that happened while agentd was down wake it once each after a restart, and none twice."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agentd.mcp.events import subscription_key
from tests.durable.daemons import daemon_until, event_cursor, wakes_with
from tests.modes.events_peer import emit, side
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text

pytestmark = pytest.mark.interop

KEY = subscription_key("ev", "ticket.created", {})


def _cursor(state: Path) -> Any:
    return event_cursor(state, KEY)


@pytest.mark.parametrize("push", [False, True], ids=["poll", "stream"])
async def test_events_missed_while_down_wake_once_each_after_a_sigkill(tmp_path: Path, push: bool) -> None:
    state = tmp_path / "state"
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv(push=push)) as peer:
        argv = [sys.executable, "-m", "agentd", "--mode", "reactive", "--intelligence", gw.url,
                "--mcp", f"ev={peer.url}", "--on-event", "ev:ticket.created", "--instruction", "Triage new tickets.",
                "--run-id", "triage", "--state-dir", str(state), "--log-level", "info"]

        # First start: the cursor is null (from now); the first answer's cursor is journaled at once.
        await daemon_until(argv, tmp_path / "1.stderr", lambda: _cursor(state) == {"cursor": "c0"})
        first = await emit(peer.url, {"title": "before the crash"})

        # A wake, then SIGKILL once its cursor is journaled (the run ended).
        await daemon_until(argv, tmp_path / "2.stderr",
                           lambda: wakes_with(gw, first[0]) == 1 and _cursor(state) == {"cursor": "c1"})
        missed = await emit(peer.url, {"title": "while down"}, count=2)  # agentd is not running

        await daemon_until(argv, tmp_path / "3.stderr",
                           lambda: all(wakes_with(gw, i) for i in missed) and _cursor(state) == {"cursor": "c3"})
        assert [wakes_with(gw, i) for i in (*first, *missed)] == [1, 1, 1]
        seen = await side(peer.url, "/_test/events")
        polls = seen["streams" if push else "polls"]
        assert polls[0]["cursor"] is None and all(p["cursor"] is not None for p in polls[1:])
        assert not seen["polls" if push else "streams"]

        # Nothing new: a further restart wakes for nothing (it resumes from c3).
        before = len(gw.requests)
        count = len(polls)
        await daemon_until(argv, tmp_path / "4.stderr",
                           lambda: len(_polls_after(peer.url, count, push)) >= 1 and _cursor(state) == {"cursor": "c3"})
        await emit(peer.url, {"title": "filler"}, name="alert.raised")  # not subscribed: nothing wakes
        assert len(gw.requests) == before
        assert [wakes_with(gw, i) for i in (*first, *missed)] == [1, 1, 1]


def _polls_after(url: str, count: int, push: bool) -> list[Any]:
    import httpx

    polls = httpx.get(url.removesuffix("/mcp") + "/_test/events").json()["streams" if push else "polls"]
    return list(polls[count:])


async def test_a_wake_killed_mid_run_is_resumed_and_its_events_are_not_woken_again(tmp_path: Path) -> None:
    import trio

    from tests.peers.gateway import RecordedRequest

    state = tmp_path / "state"
    hold, held = trio.Event(), []

    def reply(request: RecordedRequest) -> dict[str, Any]:
        if not held and 'eventId="evt-0"' in str(request.messages):
            held.append(True)
            return text("never", wait=hold)  # the first wake's model call hangs: killed here
        return text("handled")

    async with scripted_gateway(default=reply) as gw, launch.peer_server(launch.events_server_argv()) as peer:
        argv = [sys.executable, "-m", "agentd", "--mode", "reactive", "--intelligence", gw.url,
                "--mcp", f"ev={peer.url}", "--on-event", "ev:ticket.created", "--instruction", "Triage new tickets.",
                "--run-id", "triage", "--state-dir", str(state), "--log-level", "info"]
        await daemon_until(argv, tmp_path / "1.stderr", lambda: _cursor(state) == {"cursor": "c0"})
        await emit(peer.url, {"title": "in flight at the crash"})
        await daemon_until(argv, tmp_path / "1b.stderr", lambda: bool(held) and _cursor(state) == {
            "cursor": "c0", "pending": {"run": "triage.1", "cursor": "c1"}})
        [later] = await emit(peer.url, {"title": "while down"})

        await daemon_until(argv, tmp_path / "2.stderr",
                           lambda: wakes_with(gw, later) == 1 and _cursor(state) == {"cursor": "c2"})
        hold.set()
        carrying = [str(r.messages) for r in gw.requests if 'eventId="evt-0"' in str(r.messages)]
        assert len(carrying) == 2  # the killed wake's call and its resumed run's: one wake
        assert all(later not in c for c in carrying)
        armed = [line for line in (tmp_path / "2.stderr").read_text().splitlines() if '"trigger.armed"' in line]
        assert armed and '"resumed_wake": "triage.1"' in armed[0].replace('":"', '": "')
