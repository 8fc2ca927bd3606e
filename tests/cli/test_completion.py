"""``agentd completion bash|zsh|fish``: the scripts, loaded by the real shells.

At a pseudo-terminal, a person's Tab: bash (and zsh when installed) read the script with ``eval "$(agentd
completion SHELL)"`` as the docs say, and a typed prefix is completed on the screen. Through bash's own
completion interface (``COMP_WORDS``/``COMP_CWORD`` and the function the script registers) every kind of
position is checked against the flag table: the commands, each command's flags, a flag's choices, paths.
fish answers ``complete -C``. The commands' own word and flag lists (the table's, for commands outside the
flag table) are checked against each command's ``--help``.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentd.config.argv import FLAGS, SUBCOMMANDS
from agentd.config.completion import flags_of
from tests.cli.helpers import clean_env, run_agentd

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each shell's script, as ``agentd completion SHELL`` prints it."""
    out = {}
    directory = tmp_path_factory.mktemp("completion")
    for shell in ("bash", "zsh", "fish"):
        result = run_agentd(["completion", shell])
        assert result.code == 0 and result.stderr == ""
        out[shell] = directory / f"agentd.{shell}"
        out[shell].write_text(result.stdout)
    return out


class Terminal:
    """A shell on a pseudo-terminal: type into it, read the screen until something shows (bounded)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                                     start_new_session=True)
        os.close(slave)
        self.screen = b""

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait_for(self, wanted: bytes, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        while wanted not in self.screen:
            left = deadline - time.monotonic()
            assert left > 0, f"{wanted!r} never appeared; the screen ends {self.screen[-1500:]!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.screen += os.read(self.master, 65536)
                except OSError:  # the shell ended: EIO
                    break
        assert wanted in self.screen, f"{wanted!r} never appeared; the screen ends {self.screen[-1500:]!r}"
        return self.screen

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self.master)


#: The command line a person completes is ``agentd ...``; at these prompts ``agentd`` is a shell function that
#: shows the words it was given (the completion is the shell's, whatever the command is).
_STAND_IN = 'agentd() { echo "ran: [$*]"; };'


def _shell_env() -> dict[str, str]:
    env = clean_env({"TERM": "dumb", "HOME": "/nonexistent", "PS1": "$ "})
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def test_bash_completes_commands_words_and_flags_at_a_terminal(scripts: dict[str, Path], tmp_path: Path) -> None:
    term = Terminal(["bash", "--norc", "--noprofile", "-i"], _shell_env(), tmp_path)
    try:
        term.type(f"bind 'set bell-style none'; {_STAND_IN} source {scripts['bash']}; echo LOADED\n")
        term.wait_for(b"LOADED\r\n")
        term.type("agentd chec\t\n")  # a unique prefix: completed in place
        term.wait_for(b"ran: [check]")
        term.type("agentd journal exp\t\n")
        term.wait_for(b"ran: [journal export]")
        term.type("agentd --log-for\t\n")
        term.wait_for(b"ran: [--log-format]")
        term.type("agentd --log-format hu\t\n")
        term.wait_for(b"ran: [--log-format human]")
    finally:
        term.close()


def _bash_complete(script: Path, words: list[str], cwd: Path) -> list[str]:
    """What the script's completion function offers for ``words`` (the last one being typed), in bash."""
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
               f"$(complete -p agentd | sed -E 's/.*-F ([^ ]+) .*/\\1/'); printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                          cwd=cwd, env=_shell_env(), timeout=60, check=True)
    return [line for line in proc.stdout.splitlines() if line]


def _names(command: str) -> list[str]:
    return sorted(name for name, _, _ in flags_of(command))


def test_bash_offers_what_the_flag_table_says(scripts: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "agentd.yaml").write_text("max_steps: 3\n")
    (tmp_path / "events.jsonl").write_text("")
    (tmp_path / "state").mkdir()
    script = scripts["bash"]

    def offered(*words: str) -> list[str]:
        return sorted(_bash_complete(script, ["agentd", *words], tmp_path))

    assert offered("") == sorted(command.name for command in SUBCOMMANDS)
    assert offered("c") == ["check", "cluster", "completion", "ctl"]
    # a run's flags: every flag of the table that plain agentd takes (and --no- for the switches)
    run_flags = offered("--")
    assert {flag.name for flag in FLAGS if "agentd" in flag.commands} <= set(run_flags)
    assert {"--no-otel", "--version", "--help"} <= set(run_flags)
    assert "--runtime-module" in run_flags and "--db" not in run_flags  # plain agentd takes a runtime module too (its connection_credentials); --db is transcript's
    assert run_flags == _names("")
    for command in SUBCOMMANDS:
        assert offered(command.name, "--") == _names(command.name), command.name
        if command.words:
            assert offered(command.name, "") == sorted(command.words)
    assert "--json" in offered("check", "--") and "--mcp" in offered("check", "--m")
    # values: choices, paths, nothing for free text; after a value the flags go on
    assert offered("--mode", "") == ["loop", "once", "reactive", "schedule"]
    assert offered("--mode", "=", "re") == ["reactive"]  # bash splits --mode=re at the '='
    assert offered("--config", "") == ["agentd.yaml", "events.jsonl", "state"]
    assert offered("--config", "ag") == ["agentd.yaml"]
    assert offered("--instruction", "") == []
    assert offered("--instruction", "hi", "--max-st") == ["--max-steps"]
    assert offered("trace", "ev") == ["events.jsonl"]
    assert offered("init", "") == ["state"]
    assert offered("top", "--tls") == ["--tls-ca"]
    assert offered("completion", "") == ["bash", "fish", "zsh"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completes_at_a_terminal(scripts: dict[str, Path], tmp_path: Path) -> None:
    term = Terminal(["zsh", "-f", "-i"], _shell_env(), tmp_path)
    try:
        term.type(f"autoload -U compinit && compinit -u -D; {_STAND_IN} source {scripts['zsh']}; "
                  "print -r -- LOADED:$_comps[agentd]\n")
        term.wait_for(b"LOADED:_agentd")
        term.type("agentd chec\t\n")
        term.wait_for(b"ran: [check]")
        term.type("agentd journal exp\t\n")
        term.wait_for(b"ran: [journal export]")
        term.type("agentd --serve-http\t\n")
        term.wait_for(b"ran: [--serve-http2]")
        term.type("agentd --mode rea\t\n")
        term.wait_for(b"ran: [--mode reactive]")
    finally:
        term.close()


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_offers_commands_flags_and_choices(scripts: dict[str, Path], tmp_path: Path) -> None:
    def offered(line: str) -> list[str]:
        proc = subprocess.run(["fish", "--no-config", "-c", f"source {scripts['fish']}; complete -C '{line}'"],
                              capture_output=True, text=True, cwd=tmp_path, env=_shell_env(), timeout=60, check=True)
        return sorted(line.split("\t")[0] for line in proc.stdout.splitlines() if line)

    assert offered("agentd ") == sorted(command.name for command in SUBCOMMANDS)
    assert offered("agentd --mode ") == ["loop", "once", "reactive", "schedule"]
    assert offered("agentd --instruction hi --max-st") == ["--max-steps"]
    assert offered("agentd check --js") == ["--json"]
    assert offered("agentd journal ") == ["export", "list", "show"]
    assert offered("agentd top --") == _names("top")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_each_script_parses_in_its_shell(scripts: dict[str, Path], shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    subprocess.run([shell, "-n", str(scripts[shell])], check=True, timeout=60)


@pytest.mark.parametrize("command", [c for c in SUBCOMMANDS if c.name not in ("check", "run", "transcript")],
                         ids=lambda c: c.name)
def test_the_table_lists_what_each_command_takes(command: object) -> None:
    """The table's words and flags for a command with its own parser are what that command's --help says."""
    result = run_agentd([command.name, "--help"])  # type: ignore[attr-defined]
    assert result.code == 0, result.stderr
    listed = set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", result.stdout, re.M))
    assert listed == {flag.partition("=")[0] for flag in command.flags} | {"--help"}  # type: ignore[attr-defined]
    for word in command.words:  # type: ignore[attr-defined]
        assert word in result.stdout, word


def test_a_mistyped_shell_is_exit_2() -> None:
    result = run_agentd(["completion", "bsh"])
    assert result.code == 2 and result.stdout == ""
    assert "bash" in result.events[0]["error"]
