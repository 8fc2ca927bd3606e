"""tests/peers/conformance.py runs the harness in both modes and scores it from checks.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.peers import conformance, launch

REFERENCE_CLIENT = Path(__file__).resolve().parents[1] / "peers" / "clients" / "reference_client.py"


@pytest.fixture
def harness() -> None:
    if not conformance.available():
        if os.environ.get("AGENTD_TEST_REQUIRE_PEERS") == "1":
            pytest.fail("conformance harness or Node 22 missing")
        pytest.skip("conformance harness or Node 22 missing (run scripts/test)")


def _write(folder: Path, statuses: list[str]) -> None:
    folder.mkdir(parents=True)
    folder.joinpath("checks.json").write_text(json.dumps([{"id": f"c{i}", "status": s} for i, s in enumerate(statuses)]))


def test_parse_results_names_and_counts(tmp_path: Path) -> None:
    _write(tmp_path / "server-tools-list-2026-11-29T12-00-00-000Z", ["SUCCESS", "INFO"])
    _write(tmp_path / "sse-retry-2026-11-29T12-00-00-000Z", ["SUCCESS", "WARNING", "FAILURE"])
    _write(tmp_path / "auth" / "metadata-default-2026-11-29T12-00-00-000Z", ["FAILURE"])
    results = conformance.parse_results(tmp_path)
    assert set(results) == {"tools-list", "sse-retry", "auth/metadata-default"}
    assert (results["tools-list"].passed, results["tools-list"].failed, results["tools-list"].infos) == (1, 0, 1)
    assert results["tools-list"].ok
    sse = results["sse-retry"]
    assert (sse.passed, sse.failed, sse.warnings) == (1, 1, 1) and not sse.ok
    assert sse.failures() == ["c2: None"]


def test_missing_scenario_counts_as_failure(tmp_path: Path) -> None:
    run = conformance._finish([], 1, b"", tmp_path, ["initialize"])
    assert run.summary() == {"initialize": (0, 1)} and run.failed == 1


@pytest.mark.interop
@pytest.mark.slow
def test_server_mode_against_sdk_peer(harness: None, sdk_server: launch.PeerProcess, tmp_path: Path) -> None:
    run = conformance.run_server(sdk_server.url, out_dir=tmp_path, suite="active")
    for generic in ("server-initialize", "ping", "tools-list", "resources-list", "resources-subscribe",
                    "resources-unsubscribe", "server-sse-multiple-streams", "dns-rebinding-protection"):
        assert run.scenarios[generic].ok, (generic, run.scenarios[generic].failures())
    # The peer has none of the harness's fixtures: fixture scenarios must be scored as failures.
    assert run.scenarios["tools-call-image"].failed >= 1
    assert run.returncode != 0


@pytest.mark.interop
@pytest.mark.slow
def test_client_mode_reference_client_passes_and_true_fails(harness: None, tmp_path: Path) -> None:
    good = conformance.run_client([sys.executable, str(REFERENCE_CLIENT)], out_dir=tmp_path / "good",
                                  scenario="initialize")
    assert good.summary() == {"initialize": (1, 0)} and good.returncode == 0
    bad = conformance.run_client("true", out_dir=tmp_path / "bad", scenario="initialize")
    assert not bad.scenarios["initialize"].ok
