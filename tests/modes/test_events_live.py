"""End to end: MCP events wake the reactive daemon (the real daemon_mode against the events-extension peer,
tests/peers/servers/events_server.py, over real loopback HTTP, and the scripted gateway). Each wake's prompt is
checked for the occurrences' data; garbage from the server is an error event, not a crash."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from agentd.client.events import EventsUnsupported
from agentd.config.model import EventSubscriptionConfig
from tests.modes.events_peer import emit, side
from tests.modes.live import config, live_daemon
from tests.modes.test_live import wake_prompts
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text
from tests.waiting import until

pytestmark = pytest.mark.interop

TICKETS = EventSubscriptionConfig("ev", "ticket.created")


async def first_poll(url: str, count: int = 1) -> None:
    """Until the daemon has polled ``count`` times (the first poll, cursor null, is "from now")."""
    async def polled() -> bool:
        return len((await side(url, "/_test/events"))["polls"]) >= count

    await until(polled, timeout=30, what=f"{count} polls")


async def stream_open(url: str) -> None:
    """Until the daemon's events/stream is open (its starting position is "now")."""
    async def open_streams() -> Any:
        return (await side(url, "/_test/events"))["open_streams"]

    await until(open_streams, timeout=30, what="the events stream open")


async def test_an_event_wakes_the_daemon_with_its_data() -> None:
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"ev": peer.url}, on_events=(TICKETS,))) as daemon:
            await first_poll(peer.url)
            [event_id] = await emit(peer.url, {"id": "T-17", "title": "printer on fire"})
            await daemon.events.wait_for("run.end", trigger="wake")
            await daemon.stop()
        [prompt] = wake_prompts(gw)
        assert "printer on fire" in prompt and "T-17" in prompt and event_id in prompt
        assert 'Event "ticket.created" on server "ev"' in prompt and "GAP" not in prompt
        polls = (await side(peer.url, "/_test/events"))["polls"]
        assert polls[0]["cursor"] is None and all(p["cursor"] for p in polls[1:])  # from now, then resumed


async def test_several_events_coalesce_into_one_wake() -> None:
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"ev": peer.url}, on_events=(TICKETS,))) as daemon:
            await first_poll(peer.url)
            ids = await emit(peer.url, {"title": "batch"}, count=3)
            await daemon.events.wait_for("run.end", trigger="wake")
            await first_poll(peer.url, len((await side(peer.url, "/_test/events"))["polls"]) + 1)
            await daemon.stop()
        [prompt] = wake_prompts(gw)
        assert all(prompt.count(f'eventId="{i}"') == 1 for i in ids)
        assert "3 MCP events occurred" in prompt
        [wake] = daemon.events.named("reactive.wake")
        assert wake["occurrences"] == 3


async def test_arguments_filter_and_a_truncated_answer_is_reported_as_a_gap() -> None:
    ops = EventSubscriptionConfig("ev", "ticket.created", {"queue": "ops"})
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"ev": peer.url}, on_events=(ops,))) as daemon:
            await first_poll(peer.url)
            await emit(peer.url, {"queue": "dev", "title": "not mine"})
            [kept] = await emit(peer.url, {"queue": "ops", "title": "mine"}, lost=2)
            await daemon.events.wait_for("run.end", trigger="wake")
            await daemon.stop()
        [prompt] = wake_prompts(gw)
        assert "mine" in prompt and "not mine" not in prompt and kept in prompt
        assert "GAP" in prompt and '"lost":true' not in prompt
        polls = (await side(peer.url, "/_test/events"))["polls"]
        assert all(p["arguments"] == {"queue": "ops"} for p in polls)


async def test_garbage_from_the_server_is_an_error_not_a_crash() -> None:
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"ev": peer.url}, on_events=(TICKETS,))) as daemon:
            await first_poll(peer.url)
            await side(peer.url, "/_test/events/garbage", kind="cursor", count=2)
            failed = await daemon.events.wait_for("events.poll_failed")
            assert "cursor must be a string or null, not int" in failed["error"]
            recovered = await daemon.events.wait_for("events.poll_recovered")
            assert recovered["failures"] == 2 and len(daemon.events.named("events.poll_failed")) == 1  # once a streak
            await side(peer.url, "/_test/events/garbage", kind="events", count=1)
            failed = await daemon.events.wait_for("events.poll_failed", 2)
            assert "'events' must be an array" in failed["error"]
            await daemon.events.wait_for("events.poll_recovered", 2)
            await side(peer.url, "/_test/events/garbage", kind="data", count=1)
            [huge] = await emit(peer.url, {"title": "huge"})
            await daemon.events.wait_for("run.end", trigger="wake")
            assert daemon.events.named("events.data_cut")[0]["event_id"] == huge
            result = await daemon.stop()
        assert daemon.error is None and result.status.value == "completed"
        [prompt] = wake_prompts(gw)
        assert huge in prompt and "over agentd's limit" in prompt and "x" * 1000 not in prompt


@pytest.mark.parametrize(("event", "delivery", "reason"), [
    ("alert.raised", None, "offers this event by webhook only; agentd receives events by poll or push (webhook "
                           "only where it serves HTTPS"),
    ("alert.raised", "webhook", "delivery: webhook needs agentd to serve HTTPS"),
    ("ticket.created", "push", "delivery: push is not offered for this event (the server offers: poll)"),
    ("nope.never", None, "lists no such event type (it lists: ticket.created, alert.raised)"),
])
async def test_an_event_the_server_cannot_deliver_by_poll_or_push_is_a_config_error(
        event: str, delivery: str | None, reason: str) -> None:
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv()) as peer:
        cfg = config(gw.url, {"ev": peer.url}, on_events=(EventSubscriptionConfig("ev", event, delivery=delivery),))
        async with live_daemon(cfg, armed=0) as daemon:
            with trio.fail_after(30):
                await daemon.done.wait()
        assert isinstance(daemon.error, EventsUnsupported), daemon.error
        assert reason in str(daemon.error)
        assert not gw.requests


async def test_a_pushed_event_wakes_and_a_dropped_stream_resumes_from_its_cursor() -> None:
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv(push=True)) as peer:
        async with live_daemon(config(gw.url, {"ev": peer.url}, on_events=(TICKETS,))) as daemon:
            armed = daemon.events.named("trigger.armed", trigger="event")[0]
            assert armed["delivery"] == "push"
            await stream_open(peer.url)
            [first] = await emit(peer.url, {"title": "pushed"})
            await daemon.events.wait_for("run.end", trigger="wake")
            await side(peer.url, "/_test/events/drop_streams")
            [second] = await emit(peer.url, {"title": "while the stream was down"})
            await daemon.events.wait_for("run.end", 2, trigger="wake")
            await daemon.stop()
        prompts = wake_prompts(gw)
        assert [sum(f'eventId="{i}"' in p for p in prompts) for i in (first, second)] == [1, 1]
        seen = await side(peer.url, "/_test/events")
        assert not seen["polls"]
        assert [s["cursor"] for s in seen["streams"]][:2] == [None, "c1"]


async def test_garbage_on_a_stream_is_an_error_and_the_stream_is_reopened() -> None:
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv(push=True)) as peer:
        async with live_daemon(config(gw.url, {"ev": peer.url}, on_events=(TICKETS,))) as daemon:
            await stream_open(peer.url)
            await side(peer.url, "/_test/events/garbage", kind="cursor", count=1)
            [bad] = await emit(peer.url, {"title": "bad cursor"})
            failed = await daemon.events.wait_for("events.poll_failed")
            assert "cursor must be a string or null, not int" in failed["error"]
            [good] = await emit(peer.url, {"title": "fine"})
            # The stream re-opens from before the bad frame: the first event may wake alone, the good one after it.
            with trio.fail_after(30):
                while not any(good in p for p in wake_prompts(gw)):
                    ended = len(daemon.events.named("run.end", trigger="wake"))
                    await daemon.events.wait_for("run.end", count=ended + 1, trigger="wake")
            await daemon.stop()
        assert daemon.error is None
        prompts = wake_prompts(gw)
        assert any(good in p for p in prompts)
        streams = (await side(peer.url, "/_test/events"))["streams"]
        assert len(streams) >= 2 and streams[1]["cursor"] == "c0"  # re-opened from before the bad frame
        del bad


async def test_event_wakes_obey_the_wake_budget() -> None:
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv(push=True)) as peer:
        cfg = config(gw.url, {"ev": peer.url}, on_events=(TICKETS,), max_wakes_per_uri_per_minute=1)
        async with live_daemon(cfg) as daemon:
            await stream_open(peer.url)
            [first] = await emit(peer.url, {"title": "one"})
            await daemon.events.wait_for("run.end", trigger="wake")
            [second] = await emit(peer.url, {"title": "two"})
            throttled = await daemon.events.wait_for("reactive.throttled")
            assert throttled["uri"] == "event:ev/ticket.created" and throttled["scope"] == "uri"
            await daemon.stop()
        prompts = wake_prompts(gw)
        assert len(prompts) == 1 and first in prompts[0] and second not in prompts[0]


async def test_a_server_without_the_extension_is_a_config_error() -> None:
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.sdk_server_argv()) as peer:
        cfg = config(gw.url, {"ev": peer.url}, on_events=(TICKETS,))
        async with live_daemon(cfg, armed=0) as daemon:
            with trio.fail_after(30):
                await daemon.done.wait()
        assert isinstance(daemon.error, EventsUnsupported), daemon.error
        assert "MCP events need the 2026-07-28 protocol" in str(daemon.error) or \
            "does not declare the events extension" in str(daemon.error)
        assert not gw.requests
