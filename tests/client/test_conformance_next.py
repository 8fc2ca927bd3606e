"""Conformance 0.2.0-alpha.12 (``conformance-next``), client mode, against agentd's client
(tests/client/conformance_client.py; the client-credentials scenarios are tests/connections/test_conformance_auth.py).

Every client scenario the harness lists is here: it passes (with the checks counted below) or it is an expected
failure whose reason docs/mcp-client.md gives. A scenario the harness adds fails ``test_every_scenario_is_accounted``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.peers import conformance

pytestmark = [pytest.mark.interop, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).resolve().parent / "conformance_client.py"

#: scenario -> SUCCESS checks, with no FAILURE and no WARNING.
PASSING = {
    "initialize": 1, "tools_call": 2, "sse-retry": 3, "request-metadata": 5, "http-standard-headers": 7,
    "http-custom-headers": 18, "http-invalid-tool-headers": 12, "json-schema-ref-no-deref": 1,
    "json-schema-2020-12-preservation": 9, "sep-2322-client-request-state": 5,
}
#: Passing, through tests/connections/cc_client.py (agentd's client-credentials auth).
CLIENT_CREDENTIALS = ("auth/client-credentials-basic", "auth/client-credentials-jwt")
#: Expected failures (not run here: each authorization scenario waits out its timeout), by reason; docs/mcp-client.md.
NOT_SERVICED = ("elicitation-sep1034-client-defaults",)
SKILLS = ("sep-2640-client-no-prefetch", "sep-2640-client-verify-digest", "sep-2640-client-verify-size",
          "sep-2640-client-verify-frontmatter")
OAUTH = (
    "auth/metadata-default", "auth/metadata-var1", "auth/metadata-var2", "auth/metadata-var3", "auth/basic-cimd",
    "auth/scope-from-www-authenticate", "auth/scope-from-scopes-supported", "auth/scope-omitted-when-undefined",
    "auth/scope-step-up", "auth/scope-retry-limit", "auth/token-endpoint-auth-basic", "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none", "auth/pre-registration", "auth/2025-03-26-oauth-metadata-backcompat",
    "auth/2025-03-26-oauth-endpoint-fallback", "auth/resource-mismatch", "auth/offline-access-scope",
    "auth/offline-access-not-supported", "auth/authorization-server-migration", "auth/iss-supported",
    "auth/iss-not-advertised", "auth/iss-supported-missing", "auth/iss-wrong-issuer", "auth/iss-unexpected",
    "auth/iss-normalized", "auth/metadata-issuer-mismatch", "auth/enterprise-managed-authorization", "auth/dpop",
    "auth/dpop-nonce", "auth/wif-jwt-bearer",
)


@pytest.fixture(scope="module", autouse=True)
def _harness() -> None:
    conformance.require(conformance.NEXT_ENTRY)


def test_every_scenario_is_accounted() -> None:
    listed = subprocess.run([*conformance.base_argv(conformance.NEXT_ENTRY), "list", "--client"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    names = {line.strip()[2:].split(" ")[0] for line in listed.splitlines() if line.strip().startswith("- ")}
    accounted = {*PASSING, *CLIENT_CREDENTIALS, *NOT_SERVICED, *SKILLS, *OAUTH}
    assert names == accounted, (sorted(names - accounted), sorted(accounted - names))
    docs = (ROOT / "docs" / "mcp-client.md").read_text()
    for name in (*NOT_SERVICED, *SKILLS, *OAUTH):
        assert f"`{name}`" in docs, f"docs/mcp-client.md does not explain {name}"


@pytest.mark.parametrize("scenario", sorted(PASSING))
async def test_client_scenario_next(scenario: str, tmp_path: Path) -> None:
    run = await conformance.arun_client([sys.executable, str(CLIENT)], out_dir=tmp_path, scenario=scenario,
                                        timeout_ms=30000, timeout=120, entry=conformance.NEXT_ENTRY)
    result = run.scenarios[scenario]
    assert result.failures() == [], run.output[-2000:]
    assert result.passed == PASSING[scenario], result.checks
    assert result.warnings == 0, [c for c in result.checks if c.get("status") == "WARNING"]


@pytest.mark.parametrize("scenario", NOT_SERVICED)
async def test_expected_failures_still_fail(scenario: str, tmp_path: Path) -> None:
    """agentd services no elicitation (spec §1.3), so these cannot pass; if one does, move it to PASSING."""
    run = await conformance.arun_client([sys.executable, str(CLIENT)], out_dir=tmp_path, scenario=scenario,
                                        timeout_ms=30000, timeout=120, entry=conformance.NEXT_ENTRY)
    assert run.scenarios[scenario].failed > 0
