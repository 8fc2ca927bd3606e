"""The drain latch travels by context: each run sees its own, child tasks inherit it, nobody else does."""

import trio
import trio.testing

from agentd.oversight.drain import DrainLatch, current_drain, use_drain


async def test_no_latch_installed_means_one_that_never_fires(autojump_clock: trio.testing.MockClock) -> None:
    latch = current_drain()
    assert not latch.requested
    with trio.move_on_after(3600) as scope:
        await latch.wait()
    assert scope.cancelled_caught


async def test_two_runs_in_one_process_have_separate_latches(autojump_clock: trio.testing.MockClock) -> None:
    first, second = DrainLatch(), DrainLatch()
    seen: dict[str, str | None] = {}

    async def run(name: str, latch: DrainLatch) -> None:
        with use_drain(latch):
            async with trio.open_nursery() as nursery:

                async def worker() -> None:  # a task started inside the run inherits the run's latch
                    await current_drain().wait()
                    seen[name] = current_drain().reason

                nursery.start_soon(worker)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "a", first)
            nursery.start_soon(run, "b", second)
            await trio.sleep(1)
            first.request("SIGTERM")
            await trio.sleep(1)
            assert seen == {"a": "SIGTERM"}
            second.request("operator")
    assert seen == {"a": "SIGTERM", "b": "operator"}


def test_request_is_idempotent_and_keeps_the_first_reason() -> None:
    latch = DrainLatch()
    latch.request("SIGTERM")
    latch.request("SIGINT")
    assert latch.requested and latch.reason == "SIGTERM"
