"""Health answers readiness from the questions the daemon hands it (draining? lame duck?) and the readiness checks
registered by running parts; it asks the drain latch and the operator nothing by name (they sit above telemetry)."""

from __future__ import annotations

from agentd.oversight.drain import DrainLatch
from agentd.oversight.operator import Operator
from agentd.telemetry.health import Health, probe, readiness_check, use_health


def test_readiness_follows_the_handed_questions_and_the_checks() -> None:
    latch, operator = DrainLatch(), Operator()
    health = Health(mode="serve", draining=lambda: latch.requested, lame_duck=lambda: operator.lame_duck)
    with use_health(health):
        assert probe("/readyz") == (503, b"not ready\n")  # not started yet
        health.started = True
        assert probe("/readyz") == (200, b"ok\n")
        connected = False
        with readiness_check(lambda: connected):
            assert probe("/readyz")[0] == 503
            connected = True
            assert probe("/readyz")[0] == 200
        operator.set_lame_duck(True)
        snapshot = health.snapshot()
        assert (snapshot["lame_duck"], snapshot["ready"]) == (True, False)
        assert probe("/readyz")[0] == 503 and probe("/healthz") == (200, b"ok\n")  # alive, not ready
        operator.set_lame_duck(False)
        latch.request("test")
        snapshot = health.snapshot()
        assert (snapshot["draining"], snapshot["ready"]) == (True, False)
        assert probe("/readyz")[0] == 503


def test_a_health_handed_nothing_is_never_draining_nor_lame() -> None:
    health = Health(started=True)
    assert (health.draining, health.lame_duck, health.ready()) == (False, False, True)
