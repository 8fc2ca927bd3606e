"""A config file cannot freeze or swell the daemon: ``reload`` reads it off the event loop, bounded, and every
read of a YAML file refuses a FIFO, an oversized file and aliases that expand past a bound.

Before: ``agentd ctl reload`` read the config on the event loop; a FIFO in its place froze the daemon (12 s, until
a writer came), a "billion laughs" alias bomb of a few lines took 5.6 s and 363 MB. Now each is a reload that
fails ``invalid`` at once, while a good client is served alongside within 2 s; at start-up each is exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from agentd import defaults
from agentd.config.yaml_file import read_mapping
from agentd.errors import ConfigError
from tests.ctl.daemon import ROOT, ctl
from tests.integration.agents import agentd_worker
from tests.selfmcp.test_hostile_connections import _served

pytestmark = [pytest.mark.usefixtures("no_leftover_children")]


def bomb(levels: int = 9) -> str:
    """The classic alias bomb: each level is a list of nine aliases to the one before (9**levels leaves)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        refs = ",".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_a_self_reference_and_an_oversized_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "agentd.yaml"
    path.write_text(bomb())
    with pytest.raises(ConfigError, match=rf"aliases expand past {defaults.CONFIG_MAX_NODES} nodes"):
        read_mapping(str(path), "--config")
    path.write_text("a: &a [*a]\n")
    with pytest.raises(ConfigError, match="refers to the node that contains it"):
        read_mapping(str(path), "--config")
    path.write_text("x: " + "y" * defaults.CONFIG_MAX_BYTES + "\n")
    with pytest.raises(ConfigError, match=f"larger than {defaults.CONFIG_MAX_BYTES} bytes"):
        read_mapping(str(path), "--config")
    # aliases are still YAML: a few of them, expanding to little, are fine
    path.write_text("base: &b {model: m}\nother: *b\nlist: [*b, *b]\n")
    assert read_mapping(str(path), "--config")["list"] == [{"model": "m"}, {"model": "m"}]


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "agentd.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_mapping(str(fifo), "--config")


@pytest.mark.parametrize("kind", ["bomb", "fifo"])
def test_at_start_up_a_bad_config_file_is_exit_2(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "agentd.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(bomb())
    done = subprocess.run([sys.executable, "-m", "agentd", "--config", str(path), "--intelligence", "test",
                           "--instruction", "hi"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert "--config" in done.stderr and ("expand past" in done.stderr or "not a regular file" in done.stderr)


async def test_reload_of_a_fifo_or_an_alias_bomb_fails_at_once_while_the_daemon_serves(tmp_path: Path) -> None:
    sock = str(tmp_path / "ctl.sock")
    path = tmp_path / "agentd.yaml"
    path.write_text("model: m1\n")
    argv = ["--config", str(path), "--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", "test",
            "--ctl-socket", sock, "--drain-timeout", "3"]
    async with agentd_worker(argv) as worker:
        with trio.fail_after(2):
            await _served(worker.url)
        for kind, expected in (("fifo", "not a regular file"), ("bomb", "expand past"),
                               ("huge", "larger than")):
            path.unlink()
            if kind == "fifo":
                os.mkfifo(path)
            elif kind == "bomb":
                path.write_text(bomb())
            else:
                path.write_text("x: " + "y" * (defaults.CONFIG_MAX_BYTES + 1) + "\n")
            answers: list[tuple[int, dict[str, object]]] = []

            async def reload() -> None:
                answers.append(await ctl("reload", "--socket", sock))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reload)
                with trio.fail_after(2):  # a good client, measured while the reload runs
                    await _served(worker.url)
            [(code, doc)] = answers
            assert code == 1 and doc["outcome"] == "invalid" and expected in str(doc["error"]), (kind, doc)
        path.unlink()
        path.write_text("model: m2\n")
        code, doc = await ctl("reload", "--socket", sock)
        assert code == 0 and doc["reloaded"] is True and doc["changed"] == ["model"], doc


async def test_a_secret_file_that_is_a_fifo_or_huge_is_refused_at_once(tmp_path: Path) -> None:
    """``{{secret-file:PATH}}`` is resolved on the event loop (at connect time, on reload): a FIFO there froze
    the daemon until someone wrote to it. Now a secret file must be a regular file of at most 64 KiB."""
    from agentd.security.secrets import SecretError, SecretResolver

    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    with trio.fail_after(5), pytest.raises(SecretError, match="not a regular file"):
        await trio.to_thread.run_sync(SecretResolver(env={}).resolve, f"{{{{secret-file:{fifo}}}}}",
                                      abandon_on_cancel=True)
    huge = tmp_path / "huge"
    huge.write_text("x" * (defaults.SECRET_FILE_MAX_BYTES + 1))
    with pytest.raises(SecretError, match="larger than"):
        SecretResolver(env={}).resolve(f"{{{{secret-file:{huge}}}}}")
    normal = tmp_path / "normal"
    normal.write_text("s3cret-value\n")
    assert SecretResolver(env={}).resolve(f"Bearer {{{{secret-file:{normal}}}}}") == "Bearer s3cret-value"
