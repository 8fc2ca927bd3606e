"""MCP event subscriptions in a cluster (real agentd members on loopback, a real PostgreSQL, the events-extension
peer): one member delivers each subscription; when it is SIGKILLed the next owner resumes from the cursor the
cluster recorded, so the events that happened while nobody owned it wake the agent once each, none twice."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.cluster.test_members import _member_argv, _members
from tests.modes.events_peer import emit, side
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text
from tests.waiting import until

pytestmark = pytest.mark.interop

KEY = "event:ev/ticket.created"


def _owned(tmp_path: Path, i: int) -> list[dict[str, Any]]:
    lines = (tmp_path / f"member{i}.stderr").read_text().splitlines()
    return [e for e in (json.loads(line) for line in lines if line.startswith("{"))
            if e.get("event") == "cluster.subscription_owned" and e.get("uri") == KEY]


def _wakes_with(gw: Any, event_id: str) -> int:
    marker = f'eventId="{event_id}"'
    return sum(1 for r in gw.requests if len(r.messages) <= 2 and any(
        m.get("role") == "user" and marker in str(m.get("content")) for m in r.messages))


async def _until(check: Any, timeout: float = 60) -> None:
    await until(check, timeout=timeout)


@pytest.mark.parametrize("push", [False, True], ids=["poll", "stream"])
async def test_one_member_delivers_and_the_next_owner_resumes_from_the_recorded_cursor(
        pg_dsn: str, tmp_path: Path, push: bool) -> None:
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv(push=push)) as peer:
        argv = _member_argv(pg_dsn, gw, None, "--mode", "reactive", "--mcp", f"ev={peer.url}",
                            "--on-event", "ev:ticket.created", "--instruction", "Triage new tickets.")
        async with _members(argv, 2, tmp_path) as procs:
            await _until(lambda: _owned(tmp_path, 0) or _owned(tmp_path, 1))
            owner = 0 if _owned(tmp_path, 0) else 1
            other = 1 - owner
            assert _owned(tmp_path, owner)[0]["cursor"] == "now"
            async def first_read() -> Any:  # its first poll (or stream) is "from now"
                return (await side(peer.url, "/_test/events"))["streams" if push else "polls"]

            await until(first_read, timeout=30, what="the owner's first poll or stream")
            [first] = await emit(peer.url, {"title": "one owner"})
            await _until(lambda: _wakes_with(gw, first) == 1)  # its cursor was recorded before its run started
            procs[owner].send_signal(signal.SIGKILL)
            missed = await emit(peer.url, {"title": "while nobody owned it"}, count=2)
            await _until(lambda: bool(_owned(tmp_path, other)))
            assert _owned(tmp_path, other)[0]["cursor"] == "recorded"
            await _until(lambda: all(_wakes_with(gw, i) for i in missed))
            await trio.sleep(1.5)  # real time: a window for a wrong second wake of the real members to show
        assert [_wakes_with(gw, i) for i in (first, *missed)] == [1, 1, 1]


async def test_a_webhook_subscription_has_one_owner_and_the_next_one_subscribes_from_the_recorded_cursor(
        pg_dsn: str, tmp_path: Path) -> None:
    from tests.selfmcp.certs import make_pki

    key = "event:ev/alert.raised"
    pki = make_pki(tmp_path / "pki")

    def owned(i: int) -> list[dict[str, Any]]:
        lines = (tmp_path / f"member{i}.stderr").read_text().splitlines()
        return [e for e in (json.loads(line) for line in lines if line.startswith("{"))
                if e.get("event") == "cluster.subscription_owned" and e.get("uri") == key]

    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv(webhook_ca=pki.ca)) as peer:
        argv = _member_argv(pg_dsn, gw, None, "--mode", "reactive", "--mcp", f"ev={peer.url}",
                            "--on-event", "ev:alert.raised", "--instruction", "Handle alerts.",
                            "--serve-mcp", "https://127.0.0.1:0/mcp", "--serve-cert", str(pki.server.cert),
                            "--serve-key", str(pki.server.key))
        async with _members(argv, 2, tmp_path) as procs:
            await _until(lambda: owned(0) or owned(1))
            owner = 0 if owned(0) else 1
            other = 1 - owner

            async def subscribed() -> Any:
                return (await side(peer.url, "/_test/events"))["subscribes"]

            await until(subscribed, timeout=30, what="the owner's events/subscribe")
            [first] = await emit(peer.url, {"title": "one owner"}, name="alert.raised")
            await _until(lambda: _wakes_with(gw, first) == 1)
            procs[owner].send_signal(signal.SIGKILL)
            missed = await emit(peer.url, {"title": "while nobody owned it"}, name="alert.raised", count=2)
            await _until(lambda: bool(owned(other)))
            assert owned(other)[0]["cursor"] == "recorded"
            await _until(lambda: all(_wakes_with(gw, i) for i in missed))
        subscribes = (await side(peer.url, "/_test/events"))["subscribes"]
        assert [s["cursor"] for s in subscribes[:2]] == [None, "c1"]  # the next owner, from the recorded cursor
        assert subscribes[0]["url"] != subscribes[1]["url"]  # each member its own listener and route
        assert [_wakes_with(gw, i) for i in (first, *missed)] == [1, 1, 1]
