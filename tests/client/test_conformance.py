"""The official conformance harness's client scenarios, run against agentd's client (tests/client/conformance_client.py).

Counts are recorded in docs/mcp-client.md. Auth scenarios belong to the host-config part.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.peers import conformance

pytestmark = [pytest.mark.interop, pytest.mark.slow]

CLIENT = Path(__file__).resolve().parent / "conformance_client.py"
EXPECTED = {"initialize": 1, "tools_call": 1, "sse-retry": 3}


@pytest.fixture(scope="module", autouse=True)
def _harness() -> None:
    conformance.require()


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
async def test_client_scenario(scenario: str, tmp_path: Path) -> None:
    # Scenarios run one at a time: sse-retry measures reconnect timing, which a loaded machine skews.
    run = await conformance.arun_client([sys.executable, str(CLIENT)], out_dir=tmp_path, scenario=scenario,
                                        timeout_ms=30000, timeout=120)
    result = run.scenarios[scenario]
    assert result.failures() == [], run.output[-2000:]
    assert result.passed == EXPECTED[scenario], result.checks
    assert result.warnings == 0, [c for c in result.checks if c.get("status") == "WARNING"]
