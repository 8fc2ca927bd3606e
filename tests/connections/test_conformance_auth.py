"""The conformance harness's client-credentials scenarios against agentd's client-credentials auth."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.peers import conformance

pytestmark = [pytest.mark.interop, pytest.mark.slow]

CLIENT = Path(__file__).resolve().parent / "cc_client.py"


@pytest.fixture(scope="module", autouse=True)
def _harness() -> None:
    conformance.require()
    conformance.require(conformance.NEXT_ENTRY)


@pytest.mark.parametrize("entry", [conformance.ENTRY, conformance.NEXT_ENTRY], ids=["0.1.16", "0.2.0-alpha.12"])
@pytest.mark.parametrize(
    ("scenario", "check"),
    [
        ("auth/client-credentials-basic", "client-credentials-basic-auth"),
        ("auth/client-credentials-jwt", "client-credentials-jwt-verified"),
    ],
)
async def test_client_credentials_scenario(scenario: str, check: str, entry: Path, tmp_path: Path) -> None:
    run = await conformance.arun_client(
        [sys.executable, str(CLIENT)], out_dir=tmp_path, scenario=scenario, timeout_ms=30000, timeout=120,
        entry=entry,
    )
    result = (
        run.scenarios[scenario.split("/")[-1]] if scenario not in run.scenarios else run.scenarios[scenario]
    )
    assert result.failures() == [], run.output[-3000:]
    assert result.passed >= 1, result.checks
    assert any(c.get("id") == check and c.get("status") == "SUCCESS" for c in result.checks), result.checks
