"""``agentd trace FILE``: a saved JSON-lines event log (agentd's stderr) told as the story of the run.

    agentd ... 2> events.jsonl; agentd trace events.jsonl
    agentd ... 2>&1 >/dev/null | agentd trace -

Lines that are not JSON are shown as they are. Only the events that tell the story of a run are shown unless
``--all`` is given. Output piped into ``head`` ends quietly when the reader goes away.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TextIO

from agentd.terminal.mode import color_allowed, is_terminal
from agentd.terminal.story import Line, describe, expand, indent


def lines_of(source: Iterable[str], *, everything: bool = False) -> Iterable[Line]:
    for raw in source:
        raw = raw.rstrip("\n")
        if not raw.strip():
            continue
        try:
            event = json.loads(raw)
        except ValueError:
            yield Line(0, "dim", raw)
            continue
        if not isinstance(event, dict):
            continue
        for inner in expand(event):
            line = describe(inner, everything=everything)
            if line is not None:
                yield line


def trace(source: Iterable[str], out: TextIO, *, everything: bool = False, color: bool = False) -> None:
    """Write the story of ``source`` to ``out``: ``HH:MM:SS.mmm | text``, styled only when ``color``."""
    if color:
        from rich.text import Text

        from agentd.terminal.live import STYLES, console_for

        console = console_for(out, color=True)
        for line in lines_of(source, everything=everything):
            text = Text(f"{line.ts[11:23]:12} | ", style="dim")
            text.append(indent(line), style="dim")
            text.append(line.text, style=STYLES[line.tone])
            console.print(text)
        return
    for line in lines_of(source, everything=everything):
        out.write(f"{line.ts[11:23]:12} | {indent(line)}{line.text}\n")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentd trace", description=(__doc__ or "").splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("file", metavar="FILE", help="events file ('-' = stdin)")
    parser.add_argument("--all", action="store_true", help="show every event, not just the story of the run")
    return parser


def trace_main(args: Sequence[str], env: Mapping[str, str]) -> int:
    """The subcommand: 0, or 2 for bad usage or an unreadable file (a message on stderr)."""
    options = _parser().parse_args(list(args))
    color = color_allowed(env) and is_terminal(sys.stdout)
    try:
        source = sys.stdin if options.file == "-" else open(options.file, encoding="utf-8", errors="replace")  # noqa: SIM115 (closed below)
    except OSError as exc:
        print(f"agentd trace: cannot read {options.file}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        with source:
            trace(source, sys.stdout, everything=options.all, color=color)
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (``| head``): point stdout at /dev/null so the interpreter's final flush is quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 0
