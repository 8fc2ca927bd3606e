"""Documents drawn for a person: ``agentd check``'s report as a table and a run's result (``--output human``).

Each takes the very document the JSON output would print (already scrubbed of secret values), so a person
and a script are told the same thing. Every string from the document is drawn as plain text (never rich markup)
through :func:`~agentd.terminal.visible.visible`: what a server sent is shown, never obeyed by the terminal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from rich.table import Table
from rich.text import Text

from agentd.terminal.live import console_for
from agentd.terminal.visible import visible, visible_line


def _plain(value: Any, style: str = "") -> Text:
    """``value`` as one line of plain text (no markup), its control characters shown."""
    return Text(visible_line(str(value)), style=style)


def check_table(doc: Mapping[str, Any], out: TextIO, *, color: bool, control_tools: Sequence[str] = ()) -> None:
    """Servers (endpoint, era, tools, resources, problems), then the built-in tools a run would add."""
    console = console_for(out, color=color)
    table = Table(title="agentd check", title_justify="left", expand=False)
    for column in ("server", "endpoint", "era", "tools", "resources", "problems"):
        table.add_column(column, overflow="fold", no_wrap=column in ("server", "endpoint"))
    for server in doc.get("servers") or []:
        tools = [t.get("name", "?") for t in server.get("tools") or []]
        resources = len(server.get("resources") or []) + len(server.get("resourceTemplates") or [])
        refused = [t.get("name", "?") for t in server.get("refusedTools") or []]
        if server.get("connected") and refused:
            problems = _plain("refused (pin mismatch): " + ", ".join(map(str, refused)), "bold yellow")
            era = str(server.get("era") or "?") + (f" ({server['protocolVersion']})" if server.get("protocolVersion") else "")
        elif server.get("connected"):
            problems = Text("—", style="dim")
            era = str(server.get("era") or "?") + (f" ({server['protocolVersion']})" if server.get("protocolVersion") else "")
        else:
            required = "required; " if server.get("required") else ""
            problems = _plain(f"{required}not connected: {server.get('error')}", "bold red")
            era = "—"
        table.add_row(_plain(server.get("name")), _plain(server.get("endpoint")), _plain(era),
                      _plain(", ".join(map(str, tools)) if tools else "none"), _plain(resources), problems)
    console.print(table)
    if control_tools:
        console.print(Text("built in (a run also offers): " + ", ".join(control_tools), style="dim"))
    verdict = "ok" if doc.get("ok") else "a required server failed (exit 6)"
    console.print(Text(verdict, style="green" if doc.get("ok") else "bold red"))


def result_text(doc: Mapping[str, Any], out: TextIO, *, color: bool) -> None:
    """A run's result document for a person: status, the answer, steps, tokens, the error if any."""
    console = console_for(out, color=color)
    status = str(doc.get("status"))
    good = status == "completed"
    usage = doc.get("usage") or {}
    head = _plain(status, "bold green" if good else "bold red")
    steps = doc.get("steps")
    head.append(visible_line(f" · {steps} step{'' if steps == 1 else 's'} · {usage.get('total_tokens')} tokens"
                             f" · run {doc.get('run_id')}"),
                style="dim")
    if doc.get("partial"):
        head.append(" · partial", style="yellow")
    console.print(head)
    if doc.get("error"):
        console.print(_plain(f"error: {doc['error']}", "bold red"))
    result = doc.get("result")
    if result is not None:
        text = result if isinstance(result, str) else json.dumps(result, indent=2, ensure_ascii=False)
        console.print(Text(visible(text)), markup=False, highlight=False)
