"""The wake budget: a flood of update notifications costs at most the configured wakes per minute, per URI
and per daemon, and an update over budget is coalesced into a later wake, never lost."""

import trio

from agentd.modes.router import Router, Wake
from agentd.modes.wake_budget import WakeBudget
from tests.modes.fakes import MemoryPool, ScriptedModel
from tests.modes.harness import running
from tests.modes.test_reactive_driver import reactive, wake_prompts


def test_budget_per_uri_then_per_daemon_over_a_sliding_minute() -> None:
    budget = WakeBudget(per_uri=2, per_daemon=3)
    assert budget.check("a", 0.0).allowed and budget.check("a", 1.0).allowed
    over = budget.check("a", 2.0)
    assert not over.allowed and over.scope == "uri" and over.wait == 58.0
    assert budget.check("b", 3.0).allowed
    full = budget.check("c", 4.0)
    assert not full.allowed and full.scope == "daemon" and full.wait == 56.0
    assert budget.check("a", 60.0).allowed  # the first start left the window
    assert WakeBudget().check("a", 0.0).allowed  # 0 = no limit


async def test_router_flood_is_bounded_and_the_last_wake_reads_the_final_state(autojump_clock: trio.abc.Clock) -> None:
    state = {"u": 0}
    reads: list[tuple[int, float]] = []

    async def wake(w: Wake) -> None:
        reads.append((state["u"], trio.current_time()))
        await trio.sleep(0.01)

    router = Router(wake, budget=WakeBudget(per_uri=5, per_daemon=0))
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        for i in range(1, 12001):  # 100 updates a second for two minutes
            state["u"] = i
            router.notify("u")
            await trio.sleep(0.01)
        await trio.sleep(120)
        await router.wait_idle()
        nursery.cancel_scope.cancel()
    # Five wakes in any minute: the leading edge, then what the sliding window allows.
    for _, at in reads:
        assert sum(1 for _, other in reads if at <= other < at + 60) <= 5
    assert len(reads) <= 5 * 3 + 1
    assert reads[-1][0] == 12000  # coalesced, never lost: the final state was read
    assert router.stats.throttled > 0


async def test_daemon_flood_costs_at_most_the_budget(autojump_clock: trio.abc.Clock) -> None:
    pool, model = MemoryPool(state={"u://a": "0", "u://b": "0"}), ScriptedModel(delay=0.05)
    config = {"subscribe": ("u://a", "u://b"), "max_wakes_per_minute": 6, "max_wakes_per_uri_per_minute": 4}
    async with running(reactive(pool, model, **config)) as daemon:
        start = trio.current_time()
        for i in range(1, 6001):  # both URIs, 100 updates a second each, for one minute
            pool.bump("u://a", f"a{i}")
            pool.bump("u://b", f"b{i}")
            await trio.sleep(0.01)
        await trio.sleep(130)
        await daemon.drain()
        throttled = daemon.named("reactive.throttled")
    prompts = wake_prompts(model)
    wakes = [when for when, text in model.requests if "This run was started because" in text]
    for at in wakes:
        assert sum(1 for other in wakes if at <= other < at + 60) <= 6
    assert len(prompts) <= 6 * 3
    assert wakes[0] - start < 0.01  # a lone (first) update still wakes at once
    assert any("a6000" in p for p in prompts) and any("b6000" in p for p in prompts)  # nothing lost
    assert throttled and {e["scope"] for e in throttled} <= {"uri", "daemon"}


async def test_a_drain_does_not_wait_out_the_budget(autojump_clock: trio.abc.Clock) -> None:
    woken: list[float] = []

    async def wake(w: Wake) -> None:
        woken.append(trio.current_time())

    router = Router(wake, budget=WakeBudget(per_uri=1))
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        router.notify("u")
        await trio.sleep(1)
        router.notify("u")  # over budget: pending for ~59 s
        await trio.sleep(1)
        closed = trio.current_time()
        router.close()
        await router.wait_idle()
        assert trio.current_time() - closed < 0.01
        nursery.cancel_scope.cancel()
    assert len(woken) == 1 and router.stats.dropped == 1
