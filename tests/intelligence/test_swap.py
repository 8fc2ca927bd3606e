"""The swappable intelligence a reload replaces (agentd.intelligence.swap), against two real scripted gateways:
a call in flight finishes on the old endpoint, the next call goes to the new one, the old client closes once
idle; a stage that cannot open changes nothing."""

from __future__ import annotations

import functools

import pytest
import trio

from agentd.errors import ConfigError
from agentd.intelligence import open_intelligence
from agentd.intelligence.swap import open_swappable
from agentd.telemetry.events import null_log
from tests.peers.gateway import scripted_gateway, text

USER = [{"role": "user", "content": "hi"}]


def opener(url: str, **options: object):  # type: ignore[no-untyped-def]
    return functools.partial(open_intelligence, [url], model="m", log=null_log(), **options)


async def test_a_call_in_flight_finishes_on_the_old_endpoint_and_the_next_goes_to_the_new():
    release = trio.Event()
    async with scripted_gateway(default=text("old", wait=release)) as old, \
            scripted_gateway(default=text("new")) as new, open_swappable(opener(old.url)) as intel:
        answers: list[str | None] = []

        async def in_flight() -> None:
            answers.append((await intel.complete(USER, [])).content)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(in_flight)
            with trio.fail_after(10):
                await old.wait_for(1)
            staged = await intel.stage(opener(new.url))
            intel.commit(staged)
            assert (await intel.complete(USER, [])).content == "new"
            release.set()
        assert answers == ["old"]
        assert len(old.requests) == 1 and len(new.requests) == 1
        intel.model = "m2"
        await intel.complete(USER, [])
        assert new.requests[-1].body["model"] == "m2"


async def test_a_stage_that_cannot_open_changes_nothing():
    async with scripted_gateway(default=text("old")) as old, open_swappable(opener(old.url)) as intel:
        with pytest.raises(ConfigError):
            await intel.stage(opener("ftp://nowhere.example"))
        assert (await intel.complete(USER, [])).content == "old"
