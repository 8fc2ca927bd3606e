"""A well-behaved client that keeps calling the server while a test throws bad traffic at it.

``kept_serving(url)`` opens a legacy session (raw httpx, the wire agentd's own client and every 2025-era
SDK speak), then, in a background task, calls ``tools/call status`` in a loop and records each round
trip. On exit it asserts that no round trip failed, that no gap between answers (nor from the last
answer to the exit) exceeded ``max_gap``, and that the probe kept answering *while* the bad traffic ran
(``hammer`` waits for rounds to land during it). That is "refused cleanly while a concurrent
well-behaved client keeps being served", measured rather than checked between bad requests.

The gaps are measured on this thread's own clock (tests/ownclock.py: the wall clock less the time the thread
waited for a CPU, and that of the server's main thread when it runs in a process of its own): a gap is the
work of the server and its flood and any stall of the server, not how busy the rest of the machine was. The
wall clock only bounds a hang (:data:`HANG`).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import httpx
import trio

from tests import ownclock
from tests.selfmcp.harness import LegacyPeer

#: Wall-clock bound on one round trip of the probe, and on its first and last one: a hang, not a gap (gaps are
#: measured on the thread's own clock, against ``max_gap``; a loaded machine stretches the wall clock).
HANG = 60.0


@attrs.define(eq=False)
class Probe:
    """What the well-behaved client saw: latencies of successful round trips and any failure."""

    latencies: list[float] = attrs.field(factory=list)
    failures: list[str] = attrs.field(factory=list)
    max_gap_seen: float = 0.0
    last_ok: float = 0.0
    #: The probe's legacy session id (a hijack target for the tests).
    session: str = ""
    _progress: trio.Event = attrs.field(factory=trio.Event)

    @property
    def rounds(self) -> int:
        return len(self.latencies)

    def _record(self, started: float, ended: float) -> None:
        self.latencies.append(ended - started)
        self.max_gap_seen = max(self.max_gap_seen, ended - self.last_ok)
        self.last_ok = ended
        self._progress.set()
        self._progress = trio.Event()

    def fail(self, failure: str) -> None:
        self.failures.append(failure)
        self._progress.set()

    async def wait_rounds(self, target: int) -> None:
        """Until at least ``target`` rounds succeeded (bound it with ``trio.fail_after``)."""
        while self.rounds < target and not self.failures:
            await self._progress.wait()


async def _round(peer: LegacyPeer) -> str | None:
    """One ``tools/call status``; ``None`` when it was answered properly, else what went wrong."""
    try:
        reply = await peer.call("tools/call", {"name": "status", "arguments": {}})
    except (httpx.HTTPError, AssertionError, ValueError) as exc:
        return f"{exc.__class__.__name__}: {exc}"
    result = reply.get("result")
    if not isinstance(result, dict) or result.get("isError") or "run_id" not in result.get("structuredContent", {}):
        return f"bad answer: {reply!r}"
    return None


@asynccontextmanager
async def kept_serving(
    url: str,
    *,
    verify: ssl.SSLContext | bool = True,
    headers: dict[str, str] | None = None,
    max_gap: float = 3.0,
    keepalive_expiry: float = 0.2,
    server_pid: int | None = None,
) -> AsyncIterator[Probe]:
    """Yield a :class:`Probe` whose background client is served throughout; assert so at exit (gaps on the
    thread's own clock, see the module's docstring; a server in another process is ``server_pid``).

    Like any well-behaved client, the probe does not reuse a connection that idled close to the server's idle
    limit (as short as 0.5 s in some tests): on a loaded machine its loop can stall that long, and a request
    sent just as the server closes the idle connection fails without the server having done anything wrong.
    """
    probe = Probe()
    others = () if server_pid is None else (server_pid,)

    def own_time() -> float:
        return ownclock.own_time(*others)

    limits = httpx.Limits(keepalive_expiry=keepalive_expiry)
    async with httpx.AsyncClient(verify=verify, timeout=HANG, limits=limits) as client:
        peer = LegacyPeer(client, url, headers=headers)
        with trio.fail_after(HANG):
            await peer.initialize()
        probe.session = peer.session or ""
        async with trio.open_nursery() as nursery:

            async def loop() -> None:
                probe.last_ok = own_time()
                while True:
                    started = own_time()
                    failure = await _round(peer)
                    if failure is not None:
                        probe.fail(failure)
                        return
                    probe._record(started, own_time())
                    await trio.sleep(0)  # a tight loop, but let the bad traffic run too

            nursery.start_soon(loop)
            try:
                yield probe
                # one more answer after the bad traffic stopped: the server is still serving
                with trio.fail_after(HANG):
                    await probe.wait_rounds(probe.rounds + 1)
            finally:
                nursery.cancel_scope.cancel()
        final_gap = own_time() - probe.last_ok
    assert not probe.failures, probe.failures
    assert probe.max_gap_seen <= max_gap, f"the well-behaved client waited {probe.max_gap_seen:.2f}s"
    assert final_gap <= max_gap + 0.5, f"no answer for {final_gap:.2f}s at the end"


async def hammer(probe: Probe, attack: Callable[[], Awaitable[None]], *, parallel: int = 8,
                 rounds: int = 5, timeout: float = 15.0) -> int:
    """Run ``attack`` in ``parallel`` tasks, over and over, until the probe answered ``rounds`` more times.

    ``attack`` makes one bad request and asserts its refusal; each task runs it at least once. Returns how
    many attacks were made.
    """
    target = probe.rounds + rounds
    made = 0
    with trio.fail_after(timeout):
        async with trio.open_nursery() as nursery:

            async def worker() -> None:
                nonlocal made
                while True:
                    await attack()
                    made += 1
                    if probe.rounds >= target or probe.failures:
                        return

            for _ in range(parallel):
                nursery.start_soon(worker)
    assert probe.rounds >= target or probe.failures
    return made
