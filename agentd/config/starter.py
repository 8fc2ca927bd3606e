"""``agentd init [DIR]``: a commented starter configuration a person edits, valid as written.

Why a command: the first run of a daemon with fifty flags should not begin with reading all of them. The file
it writes runs as is (the offline model, no servers, no network) and passes ``--validate-config`` from any
directory with nothing set in the environment; every other line is a commented setting with its default
(quoted from :mod:`agentd.defaults`, so the file never disagrees with the flags' help) and the reference
form of secrets. An existing file is never replaced without ``--force``.

stdout: one JSON document, ``{"written": PATH}``; a refusal is the usual exit-2 line.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Final

from agentd import defaults as D
from agentd.config.argv import parse_subcommand, subcommand_parser
from agentd.errors import ConfigError

FILE_NAME: Final = "agentd.yaml"


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"


def starter_text() -> str:
    """The file ``agentd init`` writes."""
    return f"""\
# agentd configuration, written by `agentd init`. Try it as it is (the offline model, no network):
#   agentd --config {FILE_NAME} --validate-config     # check it: prints the effective configuration
#   agentd --config {FILE_NAME}                       # run it: one JSON result on stdout
# Every key is also a flag (max_steps: --max-steps) and an environment variable (AGENTD_MAX_STEPS);
# Precedence: this file < environment < flags. All keys: docs/config.md and docs/cli.md ("Flags").
# Relative paths in this file are relative to the file's directory.

# What the agent should do (or instruction_file: PATH; '-' reads stdin).
instruction: "Say hello and list the tools you can use."

# The model: `test` is the offline model (no network). For a real one, an OpenAI-compatible Chat
# Completions base URL (a list fails over in order) and its token as a reference, never the token itself:
intelligence: test
# intelligence: [https://gateway.example/v1]
# intelligence_token: "{{{{secret:GATEWAY_TOKEN}}}}"    # read from the environment variable GATEWAY_TOKEN
# model: {D.MODEL}

# MCP servers (Streamable HTTP: https, or http on loopback only). Uncomment and edit:
mcp_servers:
#  - name: fs
#    url: https://mcp-fs.internal/mcp
#    headers: {{Authorization: "Bearer {{{{secret:FS_TOKEN}}}}"}}
#    required: true                       # false: log and go on without it when it fails

# Budgets, per run (the defaults):
# max_steps: {D.MAX_STEPS}
# max_tokens: {D.MAX_TOKENS}
# deadline: {_duration(D.DEADLINE)}
# max_depth: {D.MAX_DEPTH}                         # subagent tree depth; 0: no subagents

# How to run: once (the default), loop, schedule (with interval or cron) or reactive (with subscribe).
# mode: once

# Keep a journal, so an interrupted run resumes with the same run id:
# state_dir: state

# Telemetry: stderr is JSON lines when piped, a live view at a terminal.
# log_level: {D.LOG_LEVEL}
"""


def init_main(args: Sequence[str]) -> int:
    parser = subcommand_parser("init", "Write a commented starter configuration, DIR/agentd.yaml, that runs as is.")
    parser.add_argument("dir", nargs="?", default=".", metavar="DIR",
                        help="the directory to write agentd.yaml in (created if missing; default: here)")
    parser.add_argument("--force", action="store_true", help="replace an existing agentd.yaml")
    options = parse_subcommand(parser, "init", args)
    directory = os.path.abspath(options.dir)
    path = os.path.join(directory, FILE_NAME)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"agentd init: cannot create {directory} ({exc.strerror or exc})")
    if os.path.lexists(path) and not options.force:
        raise ConfigError(f"agentd init: {path} exists; nothing was written (--force replaces it)")
    _write(path, starter_text(), replace=options.force)
    print(json.dumps({"written": path}))
    sys.stdout.flush()
    return 0


def _write(path: str, text: str, *, replace: bool) -> None:
    """Write ``text`` at ``path`` whole or not at all: a new file is created exclusively (a file that appears
    meanwhile is not overwritten); a replacement goes through a temporary file and a rename."""
    try:
        if not replace:
            with open(path, "x", encoding="utf-8") as out:
                out.write(text)
            return
        fd, temporary = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.chmod(temporary, 0o644)
            os.replace(temporary, path)
        except BaseException:
            _unlink_quietly(temporary)
            raise
    except FileExistsError:
        raise ConfigError(f"agentd init: {path} exists; nothing was written (--force replaces it)")
    except OSError as exc:
        raise ConfigError(f"agentd init: cannot write {path} ({exc.strerror or exc})")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
