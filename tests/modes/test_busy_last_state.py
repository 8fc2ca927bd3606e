"""A busy reactive daemon never loses a URI's last state (the correctness row of scripts/bench/busy.py).

Many URIs on one official-SDK server, a steady stream of updates spread over them at random with the default
debounce: whatever was coalesced on the way, each touched URI's last wake must have read its final value,
and nothing may wake after that with an older one. Real server process, real loopback sockets; every wait
is bounded.
"""

import random

import pytest
import trio

from agentd import defaults
from tests.modes.live import config, live_daemon
from tests.peers import launch
from tests.peers.gateway import RecordedRequest, scripted_gateway, text
from tests.waiting import until

pytestmark = pytest.mark.interop

URIS = [f"test://busy/{i}" for i in range(30)]
UPDATES = 150
RATE = 75.0  # per second: several updates of a URI often fall into one debounce window


def _reads(request: RecordedRequest) -> list[tuple[str, int]]:
    """Every (URI, value) a wake's prompt holds (a saturated daemon batches several URIs into one wake)."""
    users = [m for m in request.messages if m.get("role") == "user"]
    if not users or request.last_message.get("role") != "user":
        return []
    prompt = str(users[-1]["content"])
    found = []
    for uri in URIS:
        marker = f'<resource uri="{uri}"'
        if marker in prompt:
            body = prompt.split(marker, 1)[1].split(">", 1)[1].split("</resource>", 1)[0].strip()
            found.append((uri, int(body)))
    return found


async def test_every_uris_last_wake_reads_its_final_value() -> None:
    rng = random.Random(7)
    async with scripted_gateway(default=text("noted")) as gw, launch.peer_server(launch.sdk_server_argv()) as peer:
        cfg = config(gw.url, {"srv": peer.url}, subscribe=tuple(URIS), debounce=defaults.DEBOUNCE,
                     max_wakes_per_minute=10**6, max_wakes_per_uri_per_minute=10**6)
        async with live_daemon(cfg, armed=len(URIS)):
            final: dict[str, int] = {}
            limiter = trio.CapacityLimiter(8)

            async def bump(uri: str) -> None:
                async with limiter:
                    value = await launch.abump(peer.url, uri)
                final[uri] = max(final.get(uri, 0), value)

            start = trio.current_time()
            async with trio.open_nursery() as senders:
                for i in range(UPDATES):
                    await trio.sleep_until(start + i / RATE)  # real time: updates at a set rate to a real daemon
                    senders.start_soon(bump, rng.choice(URIS))

            def last_reads() -> dict[str, int]:
                reads: dict[str, int] = {}
                for request in list(gw.requests):
                    reads.update(_reads(request))
                return reads

            await until(lambda: all(last_reads().get(uri) == value for uri, value in final.items()), timeout=90,
                        what="every URI's last wake read its final value")
            # real time: quiet, for a late wake of the real daemon with an older value to show
            await trio.sleep(2 * defaults.DEBOUNCE + 0.2)
            assert sum(final.values()) == UPDATES
            touched = {uri: value for uri, value in last_reads().items() if uri in final}
            assert touched == final
            wakes = [found for request in gw.requests if (found := _reads(request))]
            assert len(wakes) <= UPDATES  # coalesced, never more wakes than updates
            assert sum(map(len, wakes)) <= UPDATES  # nor more reads
