"""Pretty-print agentd's JSON-lines events (its stderr) as a readable trace.

    agentd ... 2> events.jsonl; python scripts/trace.py events.jsonl
    agentd ... 2>&1 >/dev/null | python scripts/trace.py

Lines that are not JSON are shown as they are. Only the events that tell the story of a run are shown
unless ``--all`` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any, TextIO

STORY = {
    "run.start", "run.end", "run.failed", "mcp.connected", "mcp.connect_failed", "loop.start", "loop.step",
    "tool.call", "tool.result", "tool.rejected", "loop.budget", "loop.final", "intel.retry", "intel.failover",
    "intel.error", "config.invalid",
}


def _size(value: Any) -> str:
    return f"{value} chars" if isinstance(value, int) else repr(value)[:80]


def describe(e: dict[str, Any]) -> str | None:
    name = e.get("event")
    if name == "run.start":
        return f"run {e.get('run_id')} starts: model {e.get('model')} via {', '.join(e.get('intelligence') or [])}, servers {', '.join(e.get('servers') or []) or 'none'}"
    if name == "mcp.connected":
        rest = {k: v for k, v in e.items() if k in ("server", "era", "protocol_version", "tools", "resources")}
        return "connected " + " ".join(f"{k}={v}" for k, v in rest.items())
    if name == "loop.start":
        return f"loop: {e.get('tools')} tools offered, {e.get('resources')} resources listed, budgets steps={e.get('max_steps')} tokens={e.get('max_tokens')} deadline={e.get('deadline')}s"
    if name == "loop.step":
        usage = e.get("usage") or {}
        return f"step {e.get('step')}: model asked for {e.get('tool_calls')} tool call(s), wrote {_size(e.get('content'))} (tokens so far {usage.get('total_tokens')})"
    if name == "tool.call":
        target = f"{e.get('server')}/{e.get('tool')}" if e.get("server") else (e.get("tool") or e.get("wire_name"))
        return f"  -> {target} with {_size(e.get('arguments'))} of arguments"
    if name == "tool.result":
        flag = {"rejected": " REJECTED", "fault": " FAULT"}.get(e.get("kind", ""), " isError" if e.get("is_error") else "")
        return f"  <- {e.get('tool') or e.get('wire_name')}{flag}: {e.get('size')} chars in {e.get('ms')} ms"
    if name == "tool.rejected":
        return f"     reason: {e.get('reason')}"
    if name == "loop.budget":
        return f"budget exhausted: {e.get('budget')}"
    if name == "loop.final":
        return f"final: status {e.get('status')} after {e.get('steps')} step(s), result {_size(e.get('result'))}, partial={e.get('partial')}"
    if name == "run.end":
        usage = e.get("usage") or {}
        return f"run ends: {e.get('status')} (exit {e.get('exit_code')}), {usage.get('total_tokens')} tokens" + (f", error: {e['error']}" if e.get("error") else "")
    fields = {k: v for k, v in e.items() if k not in ("ts", "level", "event", "run_id", "agent_path", "comp", "pid")}
    return f"{name} " + json.dumps(fields, ensure_ascii=False)[:160]


def trace(lines: Iterable[str], out: TextIO, *, everything: bool = False) -> None:
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            out.write(f"{'':12} | {line}\n")
            continue
        if not isinstance(event, dict) or (not everything and event.get("event") not in STORY):
            continue
        text = describe(event)
        if text:
            out.write(f"{str(event.get('ts', ''))[11:23]:12} | {text}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", help="events file (default: stdin)")
    parser.add_argument("--all", action="store_true", help="show every event, not just the story of the run")
    args = parser.parse_args()
    source = open(args.file, encoding="utf-8") if args.file else sys.stdin
    with source:
        trace(source, sys.stdout, everything=args.all)


if __name__ == "__main__":
    main()
