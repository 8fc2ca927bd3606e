"""Config checks at the seams (exit 2 before any side effect): a `--cron` that can never fire; a serving
daemon mode without its instruction."""

from __future__ import annotations

import socket

import pytest

from agentd.config.load import load_config
from agentd.errors import ConfigError
from tests.integration.agents import run_agentd

BASE = ["--intelligence", "test", "--instruction", "tick", "--mode", "schedule"]


@pytest.mark.parametrize("expression", ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 31 feb *", "* * 30-31 2 *"])
def test_cron_that_never_fires_is_refused(expression: str) -> None:
    with pytest.raises(ConfigError, match="never fires"):
        load_config([*BASE, "--cron", expression], env={})


@pytest.mark.parametrize("expression", ["0 0 29 2 *", "0 0 30 2 mon", "*/5 * * * mon-fri", "0 12 31 * *"])
def test_rare_but_real_cron_is_accepted(expression: str) -> None:
    # Feb 29 (every four years) fires; with both day fields restricted either one matching is enough.
    assert load_config([*BASE, "--cron", expression], env={}).modes.cron == expression


async def test_cli_exits_2_before_connecting() -> None:
    with socket.socket() as listener:  # an MCP server that must never see a connection
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        done = await run_agentd([*BASE, "--cron", "0 0 30 2 *", "--mcp", f"peer=http://127.0.0.1:{port}/mcp"],
                                timeout=60)
        assert done.returncode == 2, done.stderr.decode()[-2000:]
        assert b"never fires" in done.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()


@pytest.mark.parametrize("mode", [["--mode", "reactive", "--subscribe", "test://x"], ["--mode", "loop"]])
def test_a_serving_daemon_mode_needs_its_instruction(mode: list[str]) -> None:
    # Without one, main would run a pure worker and silently ignore the mode and its subscriptions.
    with pytest.raises(ConfigError, match=f"--mode {mode[1]} needs --instruction"):
        load_config(["--intelligence", "test", "--serve-mcp", "http://127.0.0.1:0", *mode], env={})
    assert load_config(["--intelligence", "test", "--serve-mcp", "http://127.0.0.1:0"], env={}).mode == "once"
