"""The live view of a run on a terminal: an :class:`~agentd.telemetry.events.EventLog` sink that draws each event of the
story (:mod:`agentd.terminal.story`) as a line, with a status line at the bottom (the step, what is happening
now, tokens and time so far) that is redrawn on every event.

No thread: the status line is redrawn when an event arrives (rich's ``Live`` with ``auto_refresh=False``),
and while a model request or a tool call is outstanding :meth:`HumanView.animate` (a trio task the CLI runs
beside the daemon) redraws it every :data:`REFRESH` seconds with a spinner and the time waited so far, so a
person sees the run is alive. Drawing happens on the run's own thread and never races it; with nothing
outstanding nothing is redrawn. With ``NO_COLOR`` (or when stderr is not a terminal but ``--log-format human``
was asked for) there is no status line, no animation and no escape code at all: the lines alone, each carrying
the tokens and time a step line needs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final, TextIO

import trio
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


#: Seconds between redraws of the status line while something is outstanding.
REFRESH: Final = 0.25
#: Characters of a streaming reply the status line keeps (it shows the newest half).
STREAMED_CHARS: Final = 160
#: The spinner's frames, one per redraw.
SPINNER: Final = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


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
        #: When the outstanding model request or tool call began (None: nothing outstanding).
        self.since: float | None = None
        self.frame = 0
        self.daemon = False
        #: The tail of the reply streamed so far (``intel.delta``, with --log-content), shown while it arrives.
        self.streamed = ""
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

    def tick(self) -> None:
        """One redraw of the status line while something is outstanding (the spinner turns, the time counts)."""
        if self.live is not None and self.since is not None:
            self.frame += 1
            self.live.update(self._status(), refresh=True)

    async def animate(self) -> None:
        """Tick every :data:`REFRESH` seconds until cancelled; returns at once when there is no status line."""
        if self.live is None:
            return
        while True:
            await trio.sleep(REFRESH)
            self.tick()

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
            self.since = None
        elif name == "intel.call" and root:
            self.doing = "waiting for the model"
            self.since = self.clock()
            self.streamed = ""
        elif name == "intel.delta" and root and isinstance(e.get("text"), str):
            self.streamed = (self.streamed + e["text"])[-STREAMED_CHARS:]
        elif name == "tool.call" and root:
            tool = e.get("tool") or e.get("wire_name")
            self.doing = f"calling {tool} on {e['server']}" if e.get("server") else f"calling {tool}"
            self.since = self.clock()
        elif name in ("tool.result", "intel.error", "intel.result") and root:
            self.since = None
        elif name == "subagent.exit":
            self.child_tokens += int(e.get("usage_tokens") or 0)
        elif name == "proc.signal":
            self.doing = signal_text(e, self.drain_timeout)
        elif name == "run.start" and root and e.get("daemon"):
            self.daemon = True
            self.doing = "waiting for a wake"
        elif name == "proc.ready":
            self.doing = "serving" if self.step == 0 else self.doing
        elif name == "run.end" and root:
            self.since = None
            wake = self.daemon and not e.get("daemon")
            self.doing = f"{e.get('status')}; waiting for a wake" if wake else str(e.get("status"))

    def _status(self) -> Text:
        tokens = self.tokens + self.child_tokens
        mark = "⏵" if self.since is None else SPINNER[self.frame % len(SPINNER)]
        waited = "" if self.since is None else f" ({self.clock() - self.since:.0f} s)"
        head = f"step {self.step} · {tokens} tokens · " if self.step or tokens else ""
        status = Text(f"{mark} {head}{self._elapsed()} · {visible_line(self.doing)}{waited}", style="dim")
        tail = " ".join(self.streamed.split())  # one line: the newest words of the reply
        if self.since is not None and tail:
            status.append(f" · {visible_line(tail[-STREAMED_CHARS // 2:])}", style="italic")
        return status
