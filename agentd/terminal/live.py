"""The live view of a run on a terminal: an :class:`~agentd.events.EventLog` sink that draws each event of the
story (:mod:`agentd.terminal.story`) as a line, with a status line at the bottom (the step, what is happening
now, tokens and time so far) that is redrawn on every event.

No thread and no timer: the status line is redrawn when an event arrives (rich's ``Live`` with
``auto_refresh=False``), so drawing never races the run. With ``NO_COLOR`` (or when stderr is not a
terminal but ``--log-format human`` was asked for) there is no status line and no escape code at all: the
lines alone, each carrying the tokens and time a step line needs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from agentd.terminal.mode import is_terminal
from agentd.terminal.story import Line, Tone, depth_of, describe, expand, indent, signal_text
from agentd.terminal.visible import visible_line

STYLES: dict[Tone, str] = {
    "plain": "", "dim": "dim", "step": "bold cyan", "tool": "magenta", "ok": "green", "warn": "yellow",
    "error": "bold red",
}  # fmt: skip


def console_for(stream: TextIO, *, color: bool) -> Console:
    """A rich console on ``stream``: styled only when it is a terminal and colour is allowed."""
    styled = color and is_terminal(stream)
    return Console(file=stream, color_system="auto" if styled else None, no_color=not styled,
                   highlight=False, emoji=False, soft_wrap=True, force_terminal=styled or None)


def styled(line: Line) -> Text:
    text = Text(indent(line), style="dim")
    text.append(line.text, style=STYLES[line.tone])
    return text


class HumanView:
    """The sink. ``drain_timeout`` is what a first Ctrl-C waits for (the drain line says it); ``status`` False
    draws the lines without the status line (``agentd check`` has no steps to count)."""

    def __init__(self, stream: TextIO, *, color: bool, drain_timeout: float | None = None,
                 status: bool = True, clock: Any = time.monotonic) -> None:
        self.console = console_for(stream, color=color)
        self.drain_timeout = drain_timeout
        self.clock = clock
        self.started = clock()
        self.step = 0
        self.tokens = 0
        self.child_tokens = 0
        self.doing = "starting"
        self.live: Live | None = None
        if status and color and is_terminal(stream):
            self.live = Live(self._status(), console=self.console, auto_refresh=False, transient=True,
                             redirect_stdout=False, redirect_stderr=False)
            self.live.start()

    def __call__(self, event: dict[str, Any]) -> None:
        for inner in expand(event):
            self._track(inner)
            line = describe(inner, drain_timeout=self.drain_timeout)
            if line is not None:
                if line.tone == "step" and not depth_of(inner.get("agent_path")):
                    line = Line(line.depth, line.tone, f"{line.text} · {self._elapsed()}", line.ts)
                self.console.print(styled(line))
        if self.live is not None:
            self.live.update(self._status(), refresh=True)

    def close(self) -> None:
        """Take the status line down (before the process writes its result and exits)."""
        if self.live is not None:
            self.live.stop()
            self.live = None

    def _elapsed(self) -> str:
        return f"{self.clock() - self.started:.1f} s"

    def _track(self, e: Mapping[str, Any]) -> None:
        name = e.get("event")
        root = not depth_of(e.get("agent_path"))
        if name == "loop.step" and root:
            self.step = int(e.get("step") or 0)
            usage = e.get("usage")
            self.tokens = int(usage.get("total_tokens") or 0) if isinstance(usage, Mapping) else self.tokens
            self.doing = "thinking" if not e.get("tool_calls") else "acting"
        elif name == "intel.call" and root:
            self.doing = "waiting for the model"
        elif name == "tool.call" and root:
            tool = e.get("tool") or e.get("wire_name")
            self.doing = f"calling {tool} on {e['server']}" if e.get("server") else f"calling {tool}"
        elif name == "subagent.exit":
            self.child_tokens += int(e.get("usage_tokens") or 0)
        elif name == "proc.signal":
            self.doing = signal_text(e, self.drain_timeout)
        elif name == "run.end" and root:
            self.doing = str(e.get("status"))

    def _status(self) -> Text:
        tokens = self.tokens + self.child_tokens
        return Text(f"⏵ step {self.step} · {tokens} tokens · {self._elapsed()} · {visible_line(self.doing)}",
                    style="dim")
