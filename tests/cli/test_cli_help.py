"""The command line helps: the usage names every command, and a mistyped command or flag is exit 2 with the
closest real one, on stderr (JSON through a pipe, a plain line at a terminal), nothing on stdout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentd.cli import main
from agentd.config.argv import SUBCOMMANDS
from tests.cli.helpers import clean_env, run_agentd

ROOT = Path(__file__).resolve().parents[2]


def test_the_usage_names_every_command() -> None:
    out = run_agentd(["--help"])
    assert out.code == 0
    usage = out.stdout.split("\n\n")[0]
    for command in SUBCOMMANDS:
        assert f"agentd {command.synopsis}" in usage, command.name
    for name in ("top", "report", "cluster", "completion", "init"):
        assert f"agentd {name} " in usage


def test_every_command_of_the_table_is_dispatched() -> None:
    """Each command the usage names is one ``main`` answers (its --help), not a mistyped command."""
    for command in SUBCOMMANDS:
        out = run_agentd([command.name, "--help"])
        assert out.code == 0 and f"agentd {command.name}" in out.stdout, (command.name, out.stderr)


@pytest.mark.parametrize(("argv", "hint"), [
    (["chek"], "unknown command 'chek' (did you mean check?)"),
    (["complete", "bash"], "unknown command 'complete' (did you mean completion?)"),
    (["jornal", "list"], "unknown command 'jornal' (did you mean journal?)"),
    (["--max-step", "3"], "unknown flag --max-step (did you mean --max-steps?)"),
    (["--instruction", "hi", "--intelligense", "test"], "unknown flag --intelligense (did you mean --intelligence?)"),
    (["check", "--jsn"], "unknown flag --jsn (did you mean --json?)"),
    (["run", "agent.yaml", "--modle", "m"], "unknown flag --modle (did you mean --model?)"),
    (["transcript", "list", "--dbb", "x"], "unknown flag --dbb (did you mean --db?)"),
    (["init", "--forse"], "unknown flag --forse (did you mean --force?)"),
    (["completion", "bash", "--hepl"], "unknown flag --hepl (did you mean --help?)"),
    (["journal", "list", "--state-dri", "x"], "unknown flag --state-dri (did you mean --state-dir?)"),
    (["ctl", "status", "--sockett=x"], "unknown flag --sockett (did you mean --socket?)"),
    (["cluster", "status", "--clutser", "x"], "unknown flag --clutser (did you mean --cluster?)"),
    (["top", "https://127.0.0.1:9/mcp", "--tls-cert", "x"], "unknown flag --tls-cert (did you mean --tls-ca?)"),
    (["trace", "x", "--al"], "unknown flag --al (did you mean --all?)"),
    (["report", "x", "--jsno"], "unknown flag --jsno (did you mean --json?)"),
])
def test_a_mistyped_command_or_flag_says_what_was_meant(argv: list[str], hint: str, tmp_path: Path) -> None:
    out = run_agentd(argv, cwd=str(tmp_path))
    assert out.code == 2 and out.stdout == ""
    [event] = out.events
    assert event["event"] == "config.invalid" and hint in event["error"]
    assert list(tmp_path.iterdir()) == []  # nothing was written (agentd init did not run)


def test_a_word_far_from_every_command_is_not_repeated() -> None:
    """It may be a value typed in the wrong place (a token): named by count only."""
    out = run_agentd(["sk-live-0123456789abcdef"])
    assert out.code == 2 and out.stdout == ""
    assert "sk-live" not in out.stderr
    assert "the commands are check, run" in out.events[0]["error"]


def test_in_process_main_agrees() -> None:
    assert main(["chek"], env={}) == 2


def test_a_person_at_a_terminal_reads_one_plain_line() -> None:
    master, slave = os.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "agentd", "chek"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=slave, env=clean_env(), cwd=ROOT, timeout=60)
        os.close(slave)
        slave = -1
        screen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer is gone
                break
            if not chunk:
                break
            screen += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert proc.returncode == 2 and proc.stdout == b""
    text = screen.decode()
    assert "did you mean check?" in text and "{" not in text


def test_the_docs_synopsis_names_every_command() -> None:
    doc = (ROOT / "docs" / "cli.md").read_text()
    synopsis = doc.split("```")[1]
    for command in SUBCOMMANDS:
        assert f"\nagentd {command.name} " in synopsis, command.name


#: ``python -c PROBE OUT ARGS...``: the command line, and at its exit the modules loaded written to OUT (a name
#: agentd blocks, ``httpx._main`` set to None, is not a module).
PROBE = """
import atexit, sys
out = sys.argv[1]
sys.argv = ["agentd", *sys.argv[2:]]
def dump():
    with open(out, "w") as f:
        f.write("\\n".join(sorted(name for name, module in sys.modules.items() if module is not None)))
atexit.register(dump)
from agentd.cli import console_main
console_main()
"""
#: What running needs and helping must not load.
RUN_MACHINERY = ("trio", "httpx", "httpcore", "hypercorn", "jsonschema", "yaml", "cattrs", "rich",
                 "agentd.config.load", "agentd.daemon", "agentd.agent", "agentd.client", "agentd.connections",
                 "agentd.supervisor", "agentd.journal", "agentd.cluster", "agentd.terminal.live")


def _loaded(argv: list[str], tmp_path: Path) -> set[str]:
    out = tmp_path / "modules"
    proc = subprocess.run([sys.executable, "-c", PROBE, str(out), *argv], env=clean_env(), cwd=ROOT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 2), proc.stderr
    return set(out.read_text().split())


def test_the_probe_sees_a_run_load_its_machinery(tmp_path: Path) -> None:
    loaded = _loaded(["--instruction", "hi", "--intelligence", "test"], tmp_path)
    assert {"trio", "agentd.daemon", "agentd.config.load"} <= loaded


@pytest.mark.parametrize("argv", [["--help"], ["completion", "bash"], ["completion", "fish"], ["chek"],
                                  ["--max-step", "3"], ["check", "--jsn"], ["run", "a.yaml", "--modle", "m"],
                                  ["journal", "list", "--stat", "x"], ["init", "--help"]],
                         ids=" ".join)
def test_helping_loads_no_run_machinery(argv: list[str], tmp_path: Path) -> None:
    loaded = _loaded(argv, tmp_path)
    assert "agentd.config.argv" in loaded  # the probe saw the command line run
    assert sorted(name for name in loaded if name.split(".")[0] in RUN_MACHINERY or
                  any(name == m or name.startswith(m + ".") for m in RUN_MACHINERY)) == []
