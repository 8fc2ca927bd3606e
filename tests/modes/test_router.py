"""The router on the autojump clock: coalescing, independence, bounds, failures, close."""

from collections.abc import Awaitable, Callable

import trio

from agentd.modes.router import Router, Wake


class Resources:
    """Resource state plus a wake that records what it read and when (notify-then-read)."""

    def __init__(self, work: float = 0.05) -> None:
        self.state: dict[str, int] = {}
        self.work = work
        self.reads: list[tuple[str, int, float]] = []
        self.running: dict[str, int] = {}
        self.max_running: dict[str, int] = {}
        self.max_total = 0

    async def wake(self, wake: Wake) -> None:
        self.running[wake.uri] = self.running.get(wake.uri, 0) + 1
        self.max_running[wake.uri] = max(self.max_running.get(wake.uri, 0), self.running[wake.uri])
        self.max_total = max(self.max_total, sum(self.running.values()))
        try:
            await trio.sleep(0.001)  # virtual time: the read's round trip (every test here is on autojump_clock)
            self.reads.append((wake.uri, self.state.get(wake.uri, 0), trio.current_time()))
            await trio.sleep(self.work)  # virtual time: the wake's work (every test here is on autojump_clock)
        finally:
            self.running[wake.uri] -= 1

    def bump(self, router: Router, uri: str) -> None:
        self.state[uri] = self.state.get(uri, 0) + 1
        router.notify(uri, "srv")


async def with_router(router: Router, body: Callable[[], Awaitable[None]]) -> None:
    with trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            await nursery.start(router.run)
            await body()
            await router.wait_idle()
            nursery.cancel_scope.cancel()


async def test_one_update_one_immediate_wake(autojump_clock: trio.abc.Clock) -> None:
    res = Resources()
    router = Router(res.wake, debounce=0.25)

    async def body() -> None:
        start = trio.current_time()
        res.bump(router, "file:///a")
        await trio.sleep(5)
        assert [(u, v) for u, v, _ in res.reads] == [("file:///a", 1)]
        assert res.reads[0][2] - start < 0.01  # leading edge: no debounce wait for a lone change

    await with_router(router, body)
    assert router.stats.wakes == 1 and router.stats.updates == 1


async def test_burst_coalesces_and_last_wake_reads_final_state(autojump_clock: trio.abc.Clock) -> None:
    res = Resources(work=0.02)
    router = Router(res.wake, debounce=0.25)

    async def body() -> None:
        for _ in range(50):  # 50 updates in 100 ms
            res.bump(router, "u")
            await trio.sleep(0.002)

    await with_router(router, body)
    assert 1 < len(res.reads) <= 3
    assert res.reads[-1][1] == 50
    assert res.max_running["u"] == 1
    gaps = [b[2] - a[2] for a, b in zip(res.reads, res.reads[1:])]
    assert all(gap >= 0.25 for gap in gaps)  # at most one wake per debounce window


async def test_updates_during_a_long_wake_fold_into_one_follow_up(autojump_clock: trio.abc.Clock) -> None:
    res = Resources(work=10.0)
    router = Router(res.wake, debounce=0.25)

    async def body() -> None:
        res.bump(router, "u")
        await trio.sleep(1)
        for _ in range(20):
            res.bump(router, "u")
            await trio.sleep(0.1)
        assert router.running == ["u"] and router.pending == ["u"]

    await with_router(router, body)
    assert [v for _, v, _ in res.reads] == [1, 21]
    assert res.max_running["u"] == 1


async def test_update_after_read_started_earns_another_wake(autojump_clock: trio.abc.Clock) -> None:
    res = Resources(work=1.0)
    router = Router(res.wake, debounce=0.0)

    async def body() -> None:
        res.bump(router, "u")
        await trio.sleep(0.5)  # the first wake has already read value 1
        res.bump(router, "u")

    await with_router(router, body)
    assert [v for _, v, _ in res.reads] == [1, 2]


async def test_uris_are_independent_and_bounded(autojump_clock: trio.abc.Clock) -> None:
    res = Resources(work=1.0)
    router = Router(res.wake, debounce=0.25, max_concurrent=2)

    async def body() -> None:
        for uri in ("a", "b", "c", "d"):
            res.bump(router, uri)
        await trio.sleep(0.5)
        assert len(router.running) == 2 and len(router.pending) == 2

    await with_router(router, body)
    assert sorted(u for u, _, _ in res.reads) == ["a", "b", "c", "d"]
    assert res.max_total == 2


async def test_two_uris_wake_without_waiting_for_each_other(autojump_clock: trio.abc.Clock) -> None:
    res = Resources(work=5.0)
    router = Router(res.wake, debounce=0.25, max_concurrent=4)

    async def body() -> None:
        res.bump(router, "a")
        await trio.sleep(0.1)
        res.bump(router, "b")

    await with_router(router, body)
    times = {u: t for u, _, t in res.reads}
    assert times["b"] - times["a"] < 0.2


async def test_failed_wake_is_logged_and_router_continues(autojump_clock: trio.abc.Clock) -> None:
    lines: list[dict[str, object]] = []
    outcomes: list[tuple[int, str | None]] = []
    from agentd.telemetry.events import EventLog

    async def wake(w: Wake) -> None:
        if w.seq == 1:
            raise RuntimeError("boom")

    router = Router(wake, debounce=0.0, log=EventLog(sink=lines.append),
                    on_done=lambda w, e: outcomes.append((w.seq, type(e).__name__ if e else None)))

    async def body() -> None:
        router.notify("u")
        await trio.sleep(1)
        router.notify("u")

    await with_router(router, body)
    assert outcomes == [(1, "RuntimeError"), (2, None)]
    assert [line["event"] for line in lines] == ["reactive.wake_failed"]
    assert router.stats.failed == 1


async def test_close_drops_pending_and_lets_running_finish(autojump_clock: trio.abc.Clock) -> None:
    res = Resources(work=3.0)
    router = Router(res.wake, debounce=0.25)

    async def body() -> None:
        res.bump(router, "u")
        await trio.sleep(0.5)
        res.bump(router, "u")  # pending behind the running wake
        router.close()
        res.bump(router, "v")  # refused after close

    await with_router(router, body)
    assert [(u, v) for u, v, _ in res.reads] == [("u", 1)]
    assert router.stats.dropped == 2


async def test_a_saturated_router_batches_waiting_uris_into_one_wake(autojump_clock: trio.abc.Clock) -> None:
    """With ``batch`` > 1, URIs waiting for a slot ride along with the next wake, oldest first, each still
    running for that wake only (its later updates earn it a wake of its own)."""
    woken: list[tuple[str, ...]] = []
    state: dict[str, int] = {}
    reads: dict[str, list[int]] = {}

    async def wake(w: Wake) -> None:
        woken.append(tuple(item.uri for item in w.items))
        for item in w.items:
            reads.setdefault(item.uri, []).append(state[item.uri])
        await trio.sleep(1.0)

    router = Router(wake, debounce=0.25, max_concurrent=1, batch=3)

    def bump(uri: str) -> None:
        state[uri] = state.get(uri, 0) + 1
        router.notify(uri, "srv")

    async def body() -> None:
        bump("a")
        await trio.sleep(0.1)
        for uri in ("b", "c", "d", "e"):
            bump(uri)
            await trio.sleep(0.01)
        await trio.sleep(1.0)  # a ended; b took c and d along; e waits for the next slot
        bump("c")  # c is running in b's wake: folds into its own follow-up

    await with_router(router, body)
    # When b's wake ends, e (queued for the slot) and c (its follow-up now due) are woken together, in an order
    # trio leaves open: c is either already queued when e takes the slot (e takes it along) or wakes alone after.
    assert woken[:2] == [("a",), ("b", "c", "d")]
    assert woken[2:] in ([("e", "c")], [("e",), ("c",)])
    assert reads == {"a": [1], "b": [1], "c": [1, 2], "d": [1], "e": [1]}
    assert router.stats.batched == 2 + (len(woken[2]) - 1)
    assert router.stats.wakes == len(woken)


async def test_an_update_after_the_router_stopped_is_dropped_not_raised(autojump_clock: trio.abc.Clock) -> None:
    """Updates arrive on the MCP connections' own tasks, which may outlive the router: one that lands while the
    router is ending (its nursery waiting for a wake's shielded cleanup), or after, is counted as dropped. It must
    not raise into the connection's task."""

    async def wake(wake: Wake) -> None:
        try:
            await trio.sleep(10.0)
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(2.0)  # cleanup the router's nursery waits for as it closes

    router = Router(wake, debounce=0.25)
    late: list[int] = []
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as nursery:
            await nursery.start(router.run)
            router.notify("a", "srv")

            async def late_update() -> None:
                await trio.sleep(1.0)  # the router is ending, waiting for the wake's cleanup
                router.notify("b", "srv")
                late.append(router.stats.dropped)

            outer.start_soon(late_update)
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        router.notify("c", "srv")  # after it ended
    assert late == [1] and router.stats.dropped == 2
