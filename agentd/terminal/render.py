"""Documents drawn for a person: ``agentd check``'s report as a table and a run's result (``--output human``).

Each takes the very document the JSON output would print (already scrubbed of secret values), so a person
and a script are told the same thing. Every string from the document is drawn as plain text (never rich markup)
through :func:`~agentd.terminal.visible.visible`: what a server sent is shown, never obeyed by the terminal.
"""

from __future__ import annotations

import json
import time
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
    gateway = doc.get("intelligence")
    if gateway:
        _gateway_table(console, gateway)
    if doc.get("ok"):
        verdict = "ok"
    elif any(s.get("required") and not s.get("connected") for s in doc.get("servers") or []):
        verdict = "a required server failed (exit 6)"
    else:
        verdict = "the gateway check failed (exit 4)"
    console.print(Text(verdict, style="green" if doc.get("ok") else "bold red"))


def _gateway_table(console: Any, gateway: Mapping[str, Any]) -> None:
    """``agentd check --intelligence``: one row per endpoint, its hint under the table."""
    table = Table(title=f"gateway (model {visible_line(str(gateway.get('model')))})", title_justify="left",
                  expand=False)
    for column in ("endpoint", "reachable", "tls", "token", "model", "problem"):
        table.add_column(column, overflow="fold", no_wrap=column == "endpoint")
    hints = []
    for entry in gateway.get("endpoints") or []:
        if entry.get("offline"):
            table.add_row(_plain(entry.get("endpoint")), "—", "—", "—", "offline model", Text("—", style="dim"))
            continue
        known = {True: "listed", False: "not listed", None: "not checked"}[entry.get("modelKnown")]
        problem = _plain(entry["error"], "bold red") if entry.get("error") else Text("—", style="dim")
        table.add_row(_plain(entry.get("endpoint")), "yes" if entry.get("reachable") else "no",
                      _plain(entry.get("tls") or "plain http"), _plain(entry.get("token")), _plain(known), problem)
        if entry.get("hint"):
            hints.append(f"{entry.get('endpoint')}: {entry['hint']}")
    console.print(table)
    for hint in hints:
        console.print(_plain(f"hint: {hint}", "yellow"))


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


def ctl_text(command: str, doc: Mapping[str, Any], out: TextIO, *, color: bool) -> None:
    """``agentd ctl``'s answer for a person: ``status`` as a summary and a table of runs, the others as
    ``field  value`` lines, a refusal as one red line (the exit code is the JSON output's)."""
    console = console_for(out, color=color)
    if doc.get("error"):
        console.print(Text(f"agentd ctl {command}: {visible_line(str(doc['error']))}", style="bold red"), markup=False)
        return
    if command == "approvals":
        _approvals_table(doc, console)
        return
    if command != "status":
        for key, value in doc.items():
            shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
            console.print(Text(f"{key:<10} ", style="dim") + Text(visible(shown)), markup=False)
        return
    state = [name for name in ("paused", "lame_duck", "draining") if doc.get(name)]
    head = Text(f"{doc.get('mode')} daemon · run {doc.get('run_id')} · pid {doc.get('pid')} · ", style="bold")
    head.append("ready" if doc.get("ready") else "not ready", style="green" if doc.get("ready") else "bold red")
    if state:
        head.append(" · " + ", ".join(name.replace("_", " ") for name in state), style="yellow")
    console.print(head)
    supervisor = doc.get("supervisor") or {}
    capacity = doc.get("capacity") or {}
    console.print(Text(f"subagents {capacity.get('live_subagents')} live of {capacity.get('max_subagents')}"
                       f" · {supervisor.get('tokens_used')} tokens used · held {doc.get('held')}"
                       f" · {'accepting' if capacity.get('accepting') else 'not accepting'}", style="dim"))
    if doc.get("approvals"):
        console.print(Text(f"{doc['approvals']} waiting for a person (agentd ctl approvals)", style="yellow"))
    runs = doc.get("runs") or []
    if runs:
        table = Table(title_justify="left", expand=False)
        for column in ("run", "step", "paused", "running"):
            table.add_column(column, no_wrap=True)
        for run in runs:
            table.add_row(visible_line(str(run.get("run_id"))), str(run.get("step")), "yes" if run.get("paused") else "no",
                          f"{run.get('running_s')} s")
        console.print(table)
    else:
        console.print(Text("no run in flight", style="dim"))
    config = doc.get("config") or {}
    if config.get("path") or config.get("reloads"):
        console.print(Text(f"config {config.get('path') or '(command line)'} · {config.get('reloads')} reloads",
                           style="dim"))


def _approvals_table(doc: Mapping[str, Any], console: Any) -> None:
    """``agentd ctl approvals``: one row per item that waits (a tool call, or a server's question)."""
    items = list(doc.get("approvals") or [])
    if not items:
        console.print(Text("nothing waits for a person", style="dim"))
        return
    table = Table(title="waiting for a person", title_justify="left", expand=False)
    for column in ("id", "what", "run", "details", "waiting"):
        table.add_column(column, overflow="fold", no_wrap=column in ("id", "waiting"))
    for item in items:
        if item.get("kind") == "approval":
            what = str(item.get("tool"))
            args = item.get("arguments") or {}
            details = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
                                for k, v in args.items()) or "(no arguments)"
        else:
            what = f"question from {item.get('server')}"
            fields = ", ".join(map(str, ((item.get("schema") or {}).get("properties") or {}).keys()))
            details = f"{item.get('message')}" + (f" [fields: {fields}]" if fields else "")
        table.add_row(_plain(item.get("id")), _plain(what), _plain(item.get("run_id")), Text(visible(details)),
                      f"{item.get('waiting_s')} s")
    console.print(table)
    console.print(Text("agentd ctl approve ID · deny ID [REASON] · answer ID JSON", style="dim"))


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def journal_text(command: str, doc: Mapping[str, Any], out: TextIO, *, color: bool) -> None:
    """``agentd journal list`` as a table of runs, ``show RUN`` as the run's summary and a table of its records,
    a missing run as one red line."""
    console = console_for(out, color=color)
    if doc.get("error"):
        console.print(Text(f"agentd journal {command}: {visible_line(str(doc['error']))}", style="bold red"), markup=False)
        return
    runs = [doc["run"]] if command == "show" else list(doc.get("runs") or [])
    if not runs:
        console.print(Text("no runs in the journal", style="dim"))
        return
    table = Table(expand=False)
    for column in ("run", "status", "started", "ended", "parent", "records"):
        table.add_column(column, no_wrap=column in ("run", "started", "ended"))
    for run in runs:
        status = str(run.get("status"))
        tone = "green" if status == "completed" else "yellow" if status == "running" else "bold red"
        table.add_row(visible_line(str(run.get("run_id"))), Text(visible_line(status), style=tone), _when(run.get("started_at")),
                      _when(run.get("ended_at")), str(run.get("parent") or "—"), str(run.get("records")))
    console.print(table)
    if command != "show":
        return
    records = Table(expand=False)
    for column in ("seq", "time", "kind", "details"):
        records.add_column(column, overflow="fold", no_wrap=column != "details")
    for record in doc.get("records") or []:
        details = " · ".join(f"{key} {record[key]}" for key in record if key not in ("seq", "ts", "kind"))
        records.add_row(str(record.get("seq")), _when(record.get("ts")), str(record.get("kind")), visible(details))
    console.print(records)


def cluster_text(command: str, doc: Mapping[str, Any], out: TextIO, *, color: bool) -> None:
    """``agentd cluster`` for a person: ``status`` as the queue and a table of live members, ``show`` as the work
    item's fields and its answer, ``migrate``/``submit`` as one line, a refusal as one red line."""
    console = console_for(out, color=color)
    if doc.get("error"):
        console.print(Text(f"agentd cluster {command}: {visible_line(str(doc['error']))}", style="bold red"),
                      markup=False)
        return
    if command == "migrate":
        console.print(_plain(f"{doc.get('database')}: schema {doc.get('from')} → {doc.get('to')}", "green"))
        return
    if command == "submit":
        verb = "queued" if doc.get("created") else "already there (nothing queued again)"
        console.print(_plain(f"{doc.get('handle')}: {verb}", "green" if doc.get("created") else "yellow"))
        return
    if command == "status":
        age = doc.get("oldest_queued_age")
        console.print(_plain(f"{doc.get('database')} · {doc.get('running')} running · {doc.get('queued')} queued"
                             + (f" (oldest {age:.0f} s)" if isinstance(age, int | float) else "")
                             + f" · {doc.get('free_slots')} free slots", "bold"))
        members = doc.get("members") or []
        if not members:
            console.print(Text("no live member", style="yellow"))
            return
        table = Table(expand=False)
        for column in ("member", "address", "capacity", "running", "free", "heartbeat"):
            table.add_column(column, no_wrap=True)
        for member in members:
            table.add_row(visible_line(str(member.get("member"))), visible_line(str(member.get("address") or "—")),
                          str(member.get("capacity")), str(member.get("running")), str(member.get("free")),
                          f"{member.get('heartbeat_age')} s ago")
        console.print(table)
        return
    status = str(doc.get("status"))
    tone = "green" if status == "completed" else "yellow" if status in ("running", "queued") else "bold red"
    head = _plain(f"{doc.get('handle')} · ", "bold")
    head.append(visible_line(status), style=tone)
    head.append(visible_line(f" · {doc.get('kind')} · owner {doc.get('owner') or '—'} · attempts {doc.get('attempts')}"),
                style="dim")
    if doc.get("partial"):
        head.append(" · partial", style="yellow")
    console.print(head)
    result = doc.get("result")
    if result is not None:
        text = result if isinstance(result, str) else json.dumps(result, indent=2, ensure_ascii=False)
        console.print(Text(visible(text)), markup=False, highlight=False)
