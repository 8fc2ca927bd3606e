"""Which 2026-07-28 requests may be re-issued under a new id after their response stream broke."""

from __future__ import annotations

from agentd.mcp.streamable_http import reissue_safe


def test_side_effect_free_requests_are_reissued() -> None:
    for method in ("server/discover", "tools/list", "resources/list", "resources/templates/list", "prompts/list",
                   "resources/read", "subscriptions/listen"):  # fmt: skip
        assert reissue_safe(method), method


def test_calls_and_unknown_methods_are_not() -> None:
    for method in ("tools/call", "prompts/get", "completion/complete", "initialize", "ping", "x/unknown"):
        assert not reissue_safe(method), method
