"""A server's ``era:`` (``--mcp-era``): ``auto`` probes as before, ``legacy`` and ``modern`` speak one era only.

Against real peers: the 1.x-era SDK server (legacy only), the 2026-07-28-only peer, and the SDK 2.x dual-era
server; request counts come from the peers' own ``/_test/stats``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from agentd.client import EraCache, open_mcp_pool
from agentd.config.load import load_config
from agentd.errors import ConfigError, McpConnectError
from agentd.mcp.versions import Era
from tests.client.helpers import Events, server
from tests.peers import launch

pytestmark = pytest.mark.interop


def _requests(url: str) -> dict[str, int]:
    counts: dict[str, int] = launch.stats(url)["requests"]
    return counts


async def test_legacy_peer_auto_and_legacy_connect_modern_is_refused(legacy_sdk_server: launch.PeerProcess) -> None:
    url = legacy_sdk_server.url
    for era in ("auto", "legacy"):
        events = Events()
        async with open_mcp_pool([server(url, "old", era=era)], log=events.log, eras=EraCache()) as pool:
            assert pool.connections["old"].era is Era.LEGACY
            with trio.fail_after(20):
                assert (await pool.call_tool("old", "add", {"a": 1, "b": 2})).is_error is False
        (chosen,) = events.named("mcp.era")
        assert chosen["era"] == "legacy" and chosen.get("configured") is (True if era == "legacy" else None)
    # era: modern never sends initialize: the 1.x server cannot answer server/discover, so it is a connect error.
    with pytest.raises(McpConnectError, match="era is set to modern"):
        async with open_mcp_pool([server(url, "old", era="modern")], log=Events().log, eras=EraCache()):
            pass


async def test_modern_peer_modern_skips_initialize_legacy_is_refused() -> None:
    with launch.start_peer(launch.modern_server_argv(port=launch.free_port())) as peer:
        eras = EraCache()
        async with open_mcp_pool([server(peer.url, "m", era="modern")], log=Events().log, eras=eras) as pool:
            conn = pool.connections["m"]
            assert conn.era is Era.MODERN and conn.protocol_version == "2026-07-28"
            with trio.fail_after(20):
                assert (await pool.call_tool("m", "echo", {"text": "hi"})).content[0]["text"] == "hi"
        counts = _requests(peer.url)
        assert counts.get("initialize", 0) == 0 and counts["server/discover"] == 1
        assert eras.modern(peer.url) is None  # a configured era leaves the auto probe's cache alone
        with pytest.raises(McpConnectError, match="era is set to legacy"):
            async with open_mcp_pool([server(peer.url, "m", era="legacy")], log=Events().log, eras=eras):
                pass
        assert _requests(peer.url).get("server/discover") == 1  # legacy never switched
        async with open_mcp_pool([server(peer.url, "m")], log=Events().log, eras=eras) as pool:
            assert pool.connections["m"].era is Era.MODERN  # auto: initialize refused, then discover


async def test_dual_era_peer_speaks_what_is_configured(sdk_server_factory: object) -> None:
    peer = sdk_server_factory()  # type: ignore[operator]
    eras = EraCache()
    async with open_mcp_pool([server(peer.url, "d")], log=Events().log, eras=eras) as pool:
        assert pool.connections["d"].era is Era.LEGACY  # auto: the spec pins 2025-11-25 first
    before = _requests(peer.url)
    async with open_mcp_pool([server(peer.url, "d", era="modern")], log=Events().log, eras=eras) as pool:
        conn = pool.connections["d"]
        assert conn.era is Era.MODERN and conn.protocol_version == "2026-07-28"
        with trio.fail_after(20):
            assert (await pool.call_tool("d", "echo", {"text": "x"})).content[0]["text"] == "x"
    after = _requests(peer.url)
    assert after.get("initialize", 0) == before.get("initialize", 0)  # no initialize on the modern connection
    async with open_mcp_pool([server(peer.url, "d")], log=Events().log, eras=eras) as pool:
        assert pool.connections["d"].era is Era.LEGACY  # still auto-legacy: nothing was cached


def test_era_config_keys_and_flag(tmp_path: Path) -> None:
    config = tmp_path / "agentd.yaml"
    config.write_text("mcp_servers:\n  - {name: a, url: http://127.0.0.1:9/mcp, era: modern}\n"
                      "  - {name: b, url: http://127.0.0.1:9/b}\n")
    loaded = load_config(["--config", str(config), "--instruction", "x", "--intelligence", "test"], {})
    assert (loaded.server("a").era, loaded.server("b").era) == ("modern", "auto")
    flagged = load_config(["--config", str(config), "--instruction", "x", "--intelligence", "test", "--mcp-era", "a=legacy",
                           "--mcp", "c=http://127.0.0.1:9/c", "--mcp-era", "c=modern"], {})
    assert (flagged.server("a").era, flagged.server("c").era) == ("legacy", "modern")
    with pytest.raises(ConfigError, match=r"--mcp-era c: 'new' is not an era \(expected one of: auto, legacy"):
        load_config(["--mcp", "c=http://127.0.0.1:9/c", "--mcp-era", "c=new", "--instruction", "x", "--intelligence", "test"], {})
    with pytest.raises(ConfigError, match="--mcp-era z: no such MCP server"):
        load_config(["--mcp", "c=http://127.0.0.1:9/c", "--mcp-era", "z=modern", "--instruction", "x", "--intelligence", "test"], {})
    config.write_text("mcp_servers:\n  - {name: a, url: http://127.0.0.1:9/mcp, era: newest}\n")
    with pytest.raises(ConfigError, match=r"mcp_servers\[0\]\.era: 'newest' is not an era"):
        load_config(["--config", str(config), "--instruction", "x", "--intelligence", "test"], {})
    config.write_text("connections:\n  docs: {url: http://127.0.0.1:9/mcp, tools: [a], era: modern}\n")
    assert load_config(["--config", str(config), "--instruction", "x", "--intelligence", "test"], {}).server("docs").era == "modern"


def test_check_cli_speaks_the_configured_era(sdk_server_factory: object) -> None:
    """Through the real CLI: ``agentd check --mcp-era`` picks the era of a dual-era server."""
    peer = sdk_server_factory()  # type: ignore[operator]
    for era in ("legacy", "modern"):
        done = subprocess.run(
            [sys.executable, "-m", "agentd", "check", "--mcp", f"d={peer.url}", "--mcp-era", f"d={era}"],
            capture_output=True, timeout=60, check=False,
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        (doc,) = json.loads(done.stdout)["servers"]
        assert doc["era"] == era
