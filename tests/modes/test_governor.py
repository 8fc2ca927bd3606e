from agentd.modes.governor import LifetimeBudget, RestartGovernor


def test_backoff_doubles_to_cap_and_success_resets() -> None:
    gov = RestartGovernor(threshold=1000)
    waits = [gov.failure(float(i) * 100).backoff for i in range(9)]
    assert waits == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    gov.success()
    assert gov.failure(1000.0).backoff == 0.5


def test_breaker_opens_on_sixth_failure_within_a_minute() -> None:
    gov = RestartGovernor()
    verdicts = [gov.failure(t) for t in (0, 10, 20, 30, 40)]
    assert not any(v.breaker_open for v in verdicts)
    assert gov.failure(59.0).breaker_open


def test_failures_older_than_the_window_do_not_count() -> None:
    gov = RestartGovernor()
    for t in (0, 10, 20, 30, 40):
        gov.failure(t)
    verdict = gov.failure(61.0)  # the one at 0 has left the window
    assert not verdict.breaker_open and verdict.failures_in_window == 5


def test_weighted_failure_counts_several_times() -> None:
    gov = RestartGovernor()
    gov.failure(0.0, weight=3)
    assert gov.failure(1.0, weight=3).breaker_open


def test_lifetime_budget() -> None:
    unbounded = LifetimeBudget(0)
    unbounded.charge(10**9)
    assert not unbounded.exhausted and unbounded.remaining() is None and unbounded.clip(50) == 50
    budget = LifetimeBudget(100)
    budget.charge(60)
    assert budget.remaining() == 40 and budget.clip(200) == 40 and not budget.exhausted
    budget.charge(-5)
    budget.charge(40)
    assert budget.exhausted and budget.remaining() == 0
