"""``agentd completion bash|zsh|fish``: a shell completion script, written from the flag table.

Why generated: the commands (:data:`~agentd.config.argv.SUBCOMMANDS`) and the flags
(:data:`~agentd.config.argv.FLAGS`) already have one home each; a hand-written script would forget the next
flag. The script is static (every word list is in it), so pressing Tab never starts agentd. What it offers:

- the commands, as the first word;
- after a command (or none, for a run), the flags that command takes; after ``agentd check`` the flags its
  ``--help`` lists (it accepts the run flags too, unlisted);
- a command's first argument when it is one of a few words (``journal list|show|export``), a file
  (``trace FILE``) or a directory (``init DIR``);
- a flag's value: its choices (``--mode once|loop|...``), file names for a path (``--config PATH``), nothing
  for free text.

Only the standard library and the flag table are imported: ``agentd completion`` answers as fast as
``agentd --help``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

from agentd.config.argv import FLAGS, SUBCOMMANDS, Command, Subcommand

Shell = Literal["bash", "zsh", "fish"]
SHELLS: Final[tuple[Shell, ...]] = ("bash", "zsh", "fish")
#: Metavars whose value is a file or directory name.
_PATH_METAVARS: Final = frozenset({"PATH", "FILE", "DIR"})
_TABLE_COMMANDS: Final[frozenset[str]] = frozenset({"check", "run", "transcript"})

#: How a flag's value completes: "" (a switch, no value), "path", "text" or its choices.
Value = str | tuple[str, ...]


def _own_flags(command: Subcommand) -> list[tuple[str, Value, str]]:
    """(flag, value, help) of a command outside the flag table, from its ``--flag=METAVAR`` entries."""
    out: list[tuple[str, Value, str]] = []
    for entry in command.flags:
        name, _, metavar = entry.partition("=")
        value: Value = "" if not metavar else "path" if metavar in _PATH_METAVARS else "text"
        out.append((name, value, ""))
    return out


def _table_flags(command: Command) -> list[tuple[str, Value, str]]:
    """(flag, value, help) of a command of the flag table, as its ``--help`` lists them."""
    out: list[tuple[str, Value, str]] = []
    for flag in FLAGS:
        if command not in flag.commands:
            continue
        value: Value
        if flag.kind == "bool":
            value = ""
        elif flag.kind == "choice":
            value = flag.choices
        elif flag.kind == "path":
            value = "path"
        else:
            value = "text"
        out.append((flag.name, value, flag.help))
        if flag.kind == "bool" and not flag.name.startswith("--no-"):
            out.append((f"--no-{flag.name.removeprefix('--')}", "", ""))
    return out


def flags_of(command: str) -> list[tuple[str, Value, str]]:
    """What completes after ``agentd COMMAND`` (``""``: a run, no command): (flag, value kind, help)."""
    if command == "":
        return [*_table_flags("agentd"), ("--version", "", "print the version and exit"),
                ("--help", "", "show the help")]
    if command in _TABLE_COMMANDS:
        return [*_table_flags(command), ("--help", "", "show the help")]  # type: ignore[arg-type]
    entry = next(c for c in SUBCOMMANDS if c.name == command)
    return [*_own_flags(entry), ("--help", "", "show the help")]


def _value_kinds() -> dict[str, Value]:
    """Every flag that takes a value, over all commands (one name means one kind of value everywhere)."""
    kinds: dict[str, Value] = {}
    for command in ("", *(c.name for c in SUBCOMMANDS)):
        for name, value, _ in flags_of(command):
            if value:
                kinds.setdefault(name, value)
    return kinds


def _first_line(text: str, limit: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _words(items: Iterable[str]) -> str:
    return " ".join(items)


def script(shell: Shell) -> str:
    """The completion script for ``shell``."""
    if shell == "bash":
        return _bash()
    if shell == "zsh":
        return _zsh()
    return _fish()


# --- bash -------------------------------------------------------------------------------------------------


def _bash() -> str:
    kinds = _value_kinds()
    choice_cases = [f'        {name}) COMPREPLY=($(compgen -W "{_words(value)}" -- "$cur")); return ;;'
                    for name, value in kinds.items() if isinstance(value, tuple)]
    paths = "|".join(name for name, value in kinds.items() if value == "path")
    texts = "|".join(name for name, value in kinds.items() if value == "text")
    flag_cases = [f'        {c.name}) flags="{_words(n for n, _, _ in flags_of(c.name))}" ;;' for c in SUBCOMMANDS]
    word_cases = [f'        {c.name}) words="{_words(c.words)}" ;;' for c in SUBCOMMANDS if c.words]
    file_cmds = "|".join(c.name for c in SUBCOMMANDS if c.takes == "file")
    dir_cmds = "|".join(c.name for c in SUBCOMMANDS if c.takes == "dir")
    return "\n".join([
        "# agentd completion for bash. Load it in ~/.bashrc:",
        '#   eval "$(agentd completion bash)"',
        "_agentd() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd="" flags="" words=""',
        '    if [[ $prev == "=" && $COMP_CWORD -ge 2 ]]; then prev="${COMP_WORDS[COMP_CWORD-2]}"; fi',
        '    if [[ $cur == "=" ]]; then cur=""; fi',
        '    if ((COMP_CWORD > 1)) && [[ ${COMP_WORDS[1]} != -* ]]; then cmd="${COMP_WORDS[1]}"; fi',
        '    case "$prev" in',
        *choice_cases,
        f'        {paths}) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return ;;',
        f"        {texts}) COMPREPLY=(); return ;;",
        "    esac",
        '    case "$cmd" in',
        *flag_cases,
        f'        *) flags="{_words(n for n, _, _ in flags_of(""))}" ;;',
        "    esac",
        '    if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W "$flags" -- "$cur")); return; fi',
        "    if ((COMP_CWORD == 1)); then",
        f'        COMPREPLY=($(compgen -W "{_words(c.name for c in SUBCOMMANDS)}" -- "$cur")); return',
        "    fi",
        '    case "$cmd" in',
        *word_cases,
        "    esac",
        '    if [[ -n $words ]] && ((COMP_CWORD == 2)); then COMPREPLY=($(compgen -W "$words" -- "$cur")); return; fi',
        '    case "$cmd" in',
        f'        {file_cmds}) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")) ;;',
        f'        {dir_cmds}) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -d -- "$cur")) ;;',
        "        *) COMPREPLY=() ;;",
        "    esac",
        "}",
        "complete -F _agentd agentd",
        "",
    ])


# --- zsh --------------------------------------------------------------------------------------------------


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _zsh() -> str:
    kinds = _value_kinds()
    choice_cases = [f"        {name}) compadd -- {_words(value)}; return ;;"
                    for name, value in kinds.items() if isinstance(value, tuple)]
    paths = "|".join(name for name, value in kinds.items() if value == "path")
    texts = "|".join(name for name, value in kinds.items() if value == "text")

    def described(command: str) -> str:
        entries = (f"{name}:{_first_line(text)}" if text else name for name, _, text in flags_of(command))
        return " ".join(_zsh_quote(entry) for entry in entries)  # a flag name has no ':'; the help may

    flag_cases = [f"        {c.name}) flags=({described(c.name)}) ;;" for c in SUBCOMMANDS]
    word_cases = [f"        {c.name}) (( CURRENT == 3 )) && {{ compadd -- {_words(c.words)}; return }} ;;"
                  for c in SUBCOMMANDS if c.words]
    commands = " ".join(_zsh_quote(f"{c.name}:{c.summary}") for c in SUBCOMMANDS)
    file_cmds = "|".join(c.name for c in SUBCOMMANDS if c.takes == "file")
    dir_cmds = "|".join(c.name for c in SUBCOMMANDS if c.takes == "dir")
    return "\n".join([
        "#compdef agentd",
        "# agentd completion for zsh. Load it in ~/.zshrc after compinit:",
        '#   eval "$(agentd completion zsh)"',
        "# or save it as _agentd in a directory of $fpath.",
        "_agentd() {",
        "    local cur=${words[CURRENT]} prev=${words[CURRENT-1]} cmd=''",
        "    local -a flags commands",
        "    (( CURRENT > 2 )) && [[ ${words[2]} != -* ]] && cmd=${words[2]}",
        "    case $prev in",
        *choice_cases,
        f"        {paths}) _files; return ;;",
        f"        {texts}) _message 'value'; return ;;",
        "    esac",
        "    case $cmd in",
        *flag_cases,
        f"        *) flags=({described('')}) ;;",
        "    esac",
        "    if [[ $cur == -* ]]; then _describe -t flags 'flag' flags; return; fi",
        "    if (( CURRENT == 2 )); then",
        f"        commands=({commands})",
        "        _describe -t commands 'agentd command' commands; return",
        "    fi",
        "    case $cmd in",
        *word_cases,
        "    esac",
        "    case $cmd in",
        f"        {file_cmds}) _files ;;",
        f"        {dir_cmds}) _files -/ ;;",
        "    esac",
        "}",
        'if [[ "${funcstack[1]}" == "_agentd" ]]; then _agentd "$@"; else compdef _agentd agentd; fi',
        "",
    ])


# --- fish -------------------------------------------------------------------------------------------------


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish() -> str:
    lines = [
        "# agentd completion for fish. Load it now, or save it as ~/.config/fish/completions/agentd.fish:",
        "#   agentd completion fish | source",
        "function __agentd_command",
        "    set -l tokens (commandline -opc)",
        "    if test (count $tokens) -ge 2; and not string match -q -- '-*' $tokens[2]",
        "        echo $tokens[2]",
        "    end",
        "end",
        "function __agentd_in",
        "    set -l command (__agentd_command)",
        '    test "$command" = "$argv[1]"',
        "end",
        "function __agentd_args",
        "    test (count (commandline -opc)) -eq $argv[1]",
        "end",
        "complete -c agentd -f",
    ]
    for c in SUBCOMMANDS:
        lines.append(f"complete -c agentd -n '__agentd_args 1' -a {c.name} -d {_fish_quote(c.summary)}")
    for command in ("", *(c.name for c in SUBCOMMANDS)):
        condition = _fish_quote(f'__agentd_in "{command}"')
        for name, value, text in flags_of(command):
            option = f"-l {name.removeprefix('--')}"
            if isinstance(value, tuple):
                option += f" -x -a {_fish_quote(_words(value))}"
            elif value == "path":
                option += " -r -F"
            elif value == "text":
                option += " -x"
            description = f" -d {_fish_quote(_first_line(text))}" if text else ""
            lines.append(f"complete -c agentd -n {condition} {option}{description}")
    for c in SUBCOMMANDS:
        if c.words:
            condition = _fish_quote(f"__agentd_in {c.name}; and __agentd_args 2")
            lines.append(f"complete -c agentd -n {condition} -a {_fish_quote(_words(c.words))}")
        elif c.takes == "file":
            lines.append(f"complete -c agentd -n {_fish_quote(f'__agentd_in {c.name}')} -F")
        elif c.takes == "dir":
            lines.append(f"complete -c agentd -n {_fish_quote(f'__agentd_in {c.name}; and __agentd_args 2')} "
                         "-x -a '(__fish_complete_directories)'")
    return "\n".join([*lines, ""])
