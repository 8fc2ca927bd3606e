"""The story of a run in lines a person reads: event dicts (as agentd writes them on stderr) -> :class:`Line`.

Pure and standard library only: the live view (:mod:`agentd.terminal.live`) and ``agentd trace``
(:mod:`agentd.terminal.trace`) draw the same lines, one while the run happens, one from a saved log.

A subagent's own events reach its parent as ``subagent.stderr`` lines holding the child's JSON line;
:func:`expand` unwraps them (at any depth), so a child's steps and tools appear in the tree under the
``subagent.spawn`` line that started it, indented by the depth of its agent path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal

import attrs

from agentd.terminal.visible import visible_line

Tone = Literal["plain", "dim", "step", "tool", "ok", "warn", "error"]

#: Events that tell the story of a run; the rest are shown only when they are warnings or errors (or with
#: ``agentd trace --all``).
STORY: Final = frozenset({
    "run.start", "run.end", "run.failed", "run.cancelled", "mcp.connected", "mcp.connect_failed", "mcp.disconnected",
    "mcp.reconnect", "loop.start", "loop.step", "tool.call", "tool.result", "tool.rejected", "loop.budget",
    "intel.retry", "intel.failover", "intel.error", "config.invalid", "drain.start", "subagent.spawn", "subagent.exit",
    "subagent.failed", "subagent.refused", "subagent.stuck", "proc.signal", "drain.end", "log.suppressed",
    "budget.exhausted", "proc.ready",
})  # fmt: skip
#: Characters of the model's reasoning line (its text beside tool calls) that a step line shows.
REASONING_CHARS: Final = 100
#: The fields every event line has: not worth repeating in a generic rendering.
_ENVELOPE: Final = frozenset({"ts", "level", "event", "run_id", "agent_path", "comp", "pid"})


@attrs.frozen
class Line:
    """One line for a person: how deep in the subagent tree, its tone (a colour, when there is colour),
    the text, and the event's timestamp (``agentd trace`` shows it)."""

    depth: int
    tone: Tone
    text: str
    ts: str = ""


def depth_of(agent_path: Any) -> int:
    """``0`` is the root (depth 0), ``0.1`` its first child (1), ``0.1.2`` a grandchild (2)."""
    return str(agent_path or "0").count(".")


def expand(event: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """``event`` itself, or for a forwarded child line (``subagent.stderr``) the child's own event(s) inside;
    a line that is not JSON (a child's traceback) becomes a ``stderr`` pseudo-event at the child's depth."""
    if event.get("event") != "subagent.stderr" or not isinstance(event.get("line"), str):
        yield event
        return
    text = event["line"]
    try:
        inner = json.loads(text)
    except ValueError:
        inner = None
    if isinstance(inner, dict):
        yield from expand(inner)
    else:
        yield {"event": "stderr", "level": "warn", "agent_path": event.get("agent_path"), "ts": event.get("ts"),
               "line": text}


def _n(value: Any, noun: str) -> str:
    return f"{value} {noun}" + ("" if value == 1 else "s")


def _tokens(usage: Any) -> Any:
    return usage.get("total_tokens") if isinstance(usage, Mapping) else None


def _target(e: Mapping[str, Any]) -> str:
    tool = e.get("tool") or e.get("wire_name") or "?"
    return f"{tool} on {e['server']}" if e.get("server") else str(tool)


def _duration(ms: Any) -> str:
    if not isinstance(ms, int | float):
        return "?"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _first_line(text: str, limit: int = REASONING_CHARS) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def signal_text(e: Mapping[str, Any], drain_timeout: float | None = None) -> str:
    """What a Ctrl-C (or SIGTERM) does, said plainly."""
    name = "Ctrl-C" if e.get("signal") == "SIGINT" else str(e.get("signal") or "signal")
    if e.get("action") == "force":
        return f"{name} again: stopping now"
    within = f"up to {drain_timeout:g} s" if drain_timeout is not None else "for a while"
    return f"{name}: draining, {within}; press Ctrl-C again to stop now"


#: ``proc.ready``'s fields as a person reads them, in this order.
READY_LABELS: Final = (("mcp", "MCP"), ("a2a_card", "A2A card"), ("events", "events"), ("ui", "browser"),
                       ("metrics", "metrics"), ("state_dir", "state"), ("ctl_socket", "control"), ("watch", "watch"))


def ready_text(e: Mapping[str, Any]) -> str:
    """Where a daemon serves (``proc.ready``): one labelled line per address, URLs exactly as a client uses them."""
    rows = [f"  {label:<9} {e[key]}" for key, label in READY_LABELS if e.get(key)]
    return "\n".join([f"agentd is listening ({e.get('mode')} mode)", *rows])


def describe(e: Mapping[str, Any], *, everything: bool = False,
             drain_timeout: float | None = None) -> Line | None:
    """The line for one (already expanded) event, or None when it is not part of the story. Its text and
    timestamp are :func:`~agentd.terminal.visible.visible_line`: whatever a server, peer, model or child put in
    the event is drawn, never obeyed by the terminal, and stays on one line."""
    line = _describe(e, everything=everything, drain_timeout=drain_timeout)
    if line is None:
        return None
    # The banner is agentd's own block of lines: each line is made visible on its own, its breaks kept.
    text = "\n".join(visible_line(part) for part in line.text.split("\n")) if e.get("event") == "proc.ready" \
        else visible_line(line.text)
    return Line(line.depth, line.tone, text, visible_line(line.ts))


def _describe(e: Mapping[str, Any], *, everything: bool, drain_timeout: float | None) -> Line | None:
    name = str(e.get("event"))
    depth = depth_of(e.get("agent_path"))
    ts = str(e.get("ts") or "")

    def line(tone: Tone, text: str, at: int = depth) -> Line:
        return Line(max(at, 0), tone, text, ts)

    if name == "run.start":
        if depth:
            return line("dim", f"subagent {e.get('agent_path')} starts (model {e.get('model') or 'default'})")
        if e.get("trigger") is not None:  # one wake of a daemon mode
            return line("plain", f"▸ woken by {e.get('trigger')}" + (f" ({e['uri']})" if e.get("uri") else ""))
        servers = ", ".join(e.get("servers") or []) or "none"
        what = f"{e.get('mode')} daemon" if e.get("daemon") else "run"
        via = ", ".join(e.get("intelligence") or []) or "?"
        return line("plain", f"{what} {e.get('run_id')} · model {e.get('model') or 'default'} via {via}"
                             f" · servers: {servers}")
    if name == "proc.ready":
        return line("ok", ready_text(e))
    if name == "mcp.connected":
        return line("ok", f"✓ {e.get('server')} connected ({e.get('era')}, {_n(e.get('tools'), 'tool')}, "
                          f"{_n(e.get('resources'), 'resource')})")
    if name == "mcp.connect_failed":
        tone: Tone = "error" if e.get("level") == "error" else "warn"
        return line(tone, f"✗ {e.get('server')} could not connect: {e.get('error')}")
    if name in ("mcp.disconnected", "mcp.reconnect"):
        return line("warn", f"{e.get('server')}: {name.split('.')[1]}" + (f" ({e['error']})" if e.get("error") else ""))
    if name == "loop.start":
        controls = e.get("control_tools") or []
        return line("dim", f"{_n(e.get('tools'), 'tool')} offered ({len(controls)} built in), "
                           f"{_n(e.get('resources'), 'resource')} listed")
    if name == "loop.step":
        text = f"step {e.get('step')} · {_n(e.get('tool_calls'), 'tool call')} · {_tokens(e.get('usage'))} tokens"
        if isinstance(e.get("content"), str) and e.get("tool_calls") and _first_line(e["content"]):
            text += f" · “{_first_line(e['content'])}”"
        return line("step", text)
    if name == "tool.call":
        return line("tool", f"→ {_target(e)}")
    if name == "tool.result":
        kind = e.get("kind")
        failed = kind in ("rejected", "fault") or bool(e.get("is_error"))
        label = {"rejected": "rejected", "fault": "failed"}.get(str(kind), "error" if e.get("is_error") else "ok")
        return line("error" if failed else "dim", f"← {_target(e)}: {label}, {e.get('size')} chars in {_duration(e.get('ms'))}")
    if name == "tool.rejected":
        return line("warn", f"  rejected: {e.get('reason')}")
    if name == "loop.budget":
        return line("warn", f"budget exhausted: {e.get('budget')}")
    if name in ("intel.retry", "intel.failover"):
        what = "retrying the model" if name == "intel.retry" else f"failing over to {e.get('endpoint')}"
        return line("warn", f"{what} ({e.get('reason') or e.get('error') or 'attempt ' + str(e.get('attempt'))})")
    if name == "intel.error":
        return line("error", f"✗ model unavailable: {e.get('reason')}")
    if name == "run.end":
        status = e.get("status")
        tokens = _tokens(e.get("usage"))
        text = f"{status} after {_n(e.get('steps'), 'step')} · {tokens} tokens"
        if depth:
            return line("dim", f"subagent {e.get('agent_path')} {text}")
        if e.get("daemon"):
            text = f"daemon stopped: {status} · {tokens} tokens in all"
        ok = status == "completed"
        return line("ok" if ok else "error", ("✓ " if ok else "✗ ") + text
                    + (f" (exit {e.get('exit_code')})" if not ok and e.get("exit_code") is not None else "") + (f": {e['error']}" if e.get("error") else ""))
    if name == "run.cancelled":
        who = f"subagent {e.get('agent_path')} " if depth else ""
        return line("warn", f"{who}cancelled ({e.get('reason')})")
    if name == "run.failed":
        return line("error", f"✗ run failed: {e.get('error') or e.get('reason')}")
    if name == "subagent.spawn":
        return line("plain", f"├─ subagent {e.get('handle')} started (pid {e.get('child_pid')})", depth - 1)
    if name == "subagent.exit":
        ok = e.get("status") == "completed"
        return line("ok" if ok else "error",
                    f"└─ subagent {e.get('handle')} {e.get('status')} · {e.get('usage_tokens')} tokens", depth - 1)
    if name in ("subagent.failed", "subagent.refused", "subagent.stuck"):
        return line("warn", f"subagent {e.get('handle') or e.get('caller')}: {name.split('.')[1]}: {e.get('reason')}",
                    max(depth - 1, 0))
    if name == "proc.signal":
        return line("warn", signal_text(e, drain_timeout))
    if name == "drain.start":
        running = f", {_n(e.get('running'), 'run')} still running" if e.get("running") else ""
        return line("warn", f"draining ({e.get('reason')}){running}")
    if name == "drain.end":
        if e.get("outcome") == "drained":
            return line("dim", "drained" + (f" after {_n(e.get('runs'), 'wake')}" if e.get("runs") is not None else ""))
        return line("warn", f"drain timeout ({e.get('drain_timeout')} s) reached: cancelling what is left")
    if name == "loop.final" and not everything:
        return None  # run.end says it
    if name == "log.suppressed":
        return line("dim", f"({e.get('suppressed')} more {e.get('suppressed_event')} lines left out)")
    if name == "stderr":
        return line("dim", f"  {e.get('line')}")
    if e.get("level") == "error" or (e.get("level") == "warn" and name not in STORY):
        message = e.get("error") or e.get("reason") or _fields(e)
        return line("error" if e.get("level") == "error" else "warn", f"{name}: {message}")
    if everything:
        return line("dim", f"{name} {_fields(e)}")
    return None


def _fields(e: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in e.items() if k not in _ENVELOPE}, ensure_ascii=False, default=str)[:160]


def indent(line: Line) -> str:
    """The tree guides for a line's depth (``│  `` per level)."""
    return "│  " * line.depth


def error_text(message: str) -> str:
    """A process-ending error for a person (one line; the message already names no secret value; its control
    characters shown, not obeyed)."""
    return f"agentd: error: {visible_line(message)}"
