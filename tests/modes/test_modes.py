"""loop and schedule drivers, the governor and the lifetime budget, on the autojump clock."""

import datetime as dt

import pytest
import trio

from agentd.agent.result import RunStatus
from agentd.errors import ExitCode
from tests.modes.fakes import TimedJobs
from tests.modes.harness import EPOCH, context, running


async def test_loop_with_interval(autojump_clock: trio.abc.Clock) -> None:
    jobs = TimedJobs(duration=1.0)
    async with running(context(jobs, mode="loop", interval=10.0)) as daemon:
        await trio.sleep(30)
        result = await daemon.drain()
    assert jobs.times == [0, 11, 22]
    assert [rid for _, _, rid, _ in jobs.started] == ["r.1", "r.2", "r.3"]
    assert result.status is RunStatus.COMPLETED and result.exit_code is ExitCode.OK
    assert result.result == {"mode": "loop", "runs": 3, "stopped": "drained"}


async def test_loop_back_to_back(autojump_clock: trio.abc.Clock) -> None:
    jobs = TimedJobs(duration=0.25)
    async with running(context(jobs, mode="loop", interval=0.0)) as daemon:
        await trio.sleep(2.1)
        await daemon.drain()
    assert jobs.times == [0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]


async def test_failures_back_off_then_the_breaker_exits_1(autojump_clock: trio.abc.Clock) -> None:
    jobs = TimedJobs(duration=0.0, status=RunStatus.CRASHED)
    async with running(context(jobs, mode="loop", interval=0.0)) as daemon:
        result = await daemon.finished()
    # backoff 0.5, 1, 2, 4, 8 between the first six failures; the sixth within 60 s opens the breaker
    assert jobs.times == [0, 0.5, 1.5, 3.5, 7.5, 15.5]
    assert result.status is RunStatus.FAILED and result.exit_code is ExitCode.FAILURE
    assert "breaker" in (result.error or "")
    assert [e["backoff_s"] for e in daemon.named("governor.backoff")] == [0.5, 1, 2, 4, 8]
    assert len(daemon.named("governor.breaker")) == 1


async def test_success_resets_the_backoff(autojump_clock: trio.abc.Clock) -> None:
    jobs = TimedJobs(duration=0.0, status=lambda n: RunStatus.COMPLETED if n == 3 else RunStatus.FAILED)
    async with running(context(jobs, mode="loop", interval=0.0)) as daemon:
        await trio.sleep(3.2)
        await daemon.drain()
    assert jobs.times[:5] == [0, 0.5, 1.5, 1.5, 2.0]


async def test_lifetime_budget_ends_loop_with_exit_7_and_clips_the_last_run(autojump_clock: trio.abc.Clock) -> None:
    jobs = TimedJobs(duration=1.0, tokens=100)
    async with running(context(jobs, mode="loop", interval=0.0, budget_tokens_lifetime=250, max_tokens=1000)) as d:
        result = await d.finished()
    assert [limits.max_tokens for _, _, _, limits in jobs.started] == [250, 150, 50]
    assert result.status is RunStatus.EXHAUSTED_TOKENS and result.exit_code is ExitCode.BUDGET
    assert result.usage.total_tokens == 300
    assert d.named("budget.exhausted")[0]["spent"] == 300


async def test_schedule_interval_is_fixed_rate_and_skips_overruns(autojump_clock: trio.abc.Clock) -> None:
    durations = iter([1.0, 25.0, 1.0, 1.0])
    jobs = TimedJobs()

    async def job(*args):  # type: ignore[no-untyped-def]
        jobs.duration = next(durations)
        return await jobs(*args)

    async with running(context(job, mode="schedule", interval=10.0)) as daemon:
        await trio.sleep(45)
        await daemon.drain()
    assert jobs.times == [0, 10, 40]  # the fire at 10 ran until 35: the slots at 20 and 30 were skipped
    assert [e.get("skipped") for e in daemon.named("schedule.fire") if "skipped" in e] == [2]


async def test_schedule_cron_fires_at_matching_utc_minutes(autojump_clock: trio.abc.Clock) -> None:
    jobs = TimedJobs(duration=5.0)
    async with running(context(jobs, mode="schedule", cron="*/5 * * * *")) as daemon:
        await trio.sleep(11 * 60)
        await daemon.drain()
    fired = [dt.datetime.fromtimestamp(EPOCH + t, dt.UTC).strftime("%H:%M:%S") for t in jobs.times]
    assert fired == ["00:05:00", "00:10:00"]
    assert all(j.trigger == "schedule" for _, j, _, _ in jobs.started)


async def test_schedule_cron_reads_its_fields_in_cron_tz(autojump_clock: trio.abc.Clock) -> None:
    jobs = TimedJobs(duration=5.0)
    ctx = context(jobs, mode="schedule", cron="0 9 * * *", cron_tz="America/New_York")
    async with running(ctx) as daemon:
        await trio.sleep(15 * 3600)
        await daemon.drain()
    fired = [dt.datetime.fromtimestamp(EPOCH + t, dt.UTC).strftime("%H:%M:%S") for t in jobs.times]
    assert fired == ["14:00:00"]  # 09:00 EST
    armed = daemon.named("trigger.armed")[0]
    assert armed["tz"] == "America/New_York" and armed["next_fire"] == "2026-01-01T14:00:00+00:00"


async def test_drain_lets_a_running_run_finish(autojump_clock: trio.abc.Clock) -> None:
    jobs = TimedJobs(duration=10.0)
    async with running(context(jobs, mode="loop", interval=60.0, drain_timeout=25.0)) as daemon:
        await trio.sleep(2)
        start = trio.current_time()
        result = await daemon.drain()
        assert trio.current_time() - start == pytest.approx(8.0)
    assert result.exit_code is ExitCode.OK and len(jobs.started) == 1
    assert daemon.named("drain.end")[0]["outcome"] == "drained"


async def test_drain_cancels_a_run_that_outlasts_the_drain_timeout(autojump_clock: trio.abc.Clock) -> None:
    jobs = TimedJobs(duration=1000.0)
    async with running(context(jobs, mode="loop", drain_timeout=25.0)) as daemon:
        await trio.sleep(2)
        start = trio.current_time()
        result = await daemon.drain()
        assert trio.current_time() - start == pytest.approx(23.0)  # 2 s of the 25 are kept for cleanup
    assert result.exit_code is ExitCode.OK
    assert daemon.named("drain.end")[0]["outcome"] == "cut"


async def test_a_cron_expression_that_never_fires_is_a_config_error(autojump_clock: trio.abc.Clock) -> None:
    from agentd.errors import ConfigError
    from agentd.modes.drivers import run_daemon

    with pytest.raises(ConfigError, match="never fires"):
        await run_daemon(context(TimedJobs(), mode="schedule", cron="0 0 30 2 *"))
