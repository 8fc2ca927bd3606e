"""``agentd journal list|show RUN|export RUN``: read the run journal, one JSON document on stdout.

Why separate from the daemon: operators inspect a journal while the daemon runs (WAL lets a reader see
every committed batch without blocking the writer) or after it died. The file is opened read-only and
the commands are blocking: no trio, no thread.

- ``list [--limit N] [--status S]``: ``{"runs": [summary, ...]}``, most recently started first.
- ``show RUN``: the run's summary and one line per record (seq, ts, kind, and the step / call id / name
  where the record has them), without payloads.
- ``export RUN``: the whole run, every record with its payload, in a versioned document.

The journal is ``<state dir>/journal.sqlite3``; the state directory comes from ``--state-dir`` or the
environment names the caller gives (agentd.cli passes those of the daemon's ``--state-dir`` flag, whose one
home is the flag table in agentd.config.argv: ``AGENTD_STATE_DIR``, then ``AGENT_STATE_DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from agentd.errors import ConfigError
from agentd.formats.jsontext import escape_controls
from agentd.journal.sqlite import SCHEMA_VERSION, JournalFile, db_path
from agentd.journal.store import RunSummary

#: The ``format`` of an ``agentd journal export`` document.
EXPORT_FORMAT: Final = "agentd.journal.run"
#: Fields ``show`` keeps from a record (payload fields are left to ``export``).
_SHOW_FIELDS: Final = ("step", "call_id", "name", "ok", "handle", "status", "input_tokens", "output_tokens")


#: Draws a ``list`` or ``show`` document for a person: (command, document).
Show = Callable[[str, Mapping[str, Any]], None]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentd journal", description="Read the durable run journal.")
    p.add_argument("command", choices=["list", "show", "export"])
    p.add_argument("run_id", nargs="?")
    p.add_argument("--state-dir", help="the state directory (default: $AGENTD_STATE_DIR)")
    p.add_argument("--limit", type=int, default=50, help="list: at most this many runs (default 50)")
    p.add_argument("--status", help="list: only runs with this status (running, completed, ...)")
    p.add_argument("--json", action="store_true", help="list, show: print the JSON document even at a terminal")
    return p


def _summary(s: RunSummary) -> dict[str, Any]:
    return attrs.asdict(s)


def journal_main(args: Sequence[str], env: Mapping[str, str] | None = None, *,
                 state_dir_envs: Sequence[str] = (), human: Show | None = None) -> int:
    """``agentd journal``; ``state_dir_envs`` are the environment names of the state directory, in order.
    ``human`` draws ``list`` and ``show`` for a person (the CLI passes it when stdout is a terminal; ``--json``
    keeps the JSON; ``export`` is always the JSON document)."""
    env = os.environ if env is None else env
    options = _parser().parse_args(list(args))

    def out(doc: Any) -> None:
        if human is None or options.json or options.command == "export":
            _print(doc)
        else:
            human(options.command, doc)

    state_dir = options.state_dir or next((env[n] for n in state_dir_envs if env.get(n)), None)
    if not state_dir:
        hint = f" or set {state_dir_envs[0]}" if state_dir_envs else ""
        raise ConfigError(f"agentd journal: no state directory (pass --state-dir{hint})")
    if options.command != "list" and not options.run_id:
        raise ConfigError(f"agentd journal {options.command}: RUN is required")
    if options.limit <= 0:
        raise ConfigError("agentd journal list: --limit must be positive")
    path = db_path(state_dir)
    if not os.path.exists(path):
        return _no_journal(options.command, options.run_id, path, out)
    journal = JournalFile(path, readonly=True)
    try:
        if options.command == "list":
            out({"runs": [_summary(s) for s in journal.list_runs(options.limit, options.status)]})
            return 0
        summary, rows = journal.read_raw(options.run_id)
    finally:
        journal.close()
    if summary is None:
        out({"error": f"no run {options.run_id!r} in the journal"})
        return 1
    records = [{"seq": seq, "ts": ts, **json.loads(body)} for seq, ts, _, body in rows]
    if options.command == "show":
        lines = [{"seq": r["seq"], "ts": r["ts"], "kind": r["kind"],
                  **{k: r[k] for k in _SHOW_FIELDS if k in r}} for r in records]  # fmt: skip
        out({"run": _summary(summary), "records": lines})
    else:
        out({"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION, "run": _summary(summary),
             "records": records})  # fmt: skip
    return 0


def _no_journal(command: str, run_id: str | None, path: str, out: Callable[[Any], None]) -> int:
    if command == "list":
        out({"runs": []})
        return 0
    out({"error": f"no run {run_id!r} in the journal (no journal at {path})"})
    return 1


def _print(doc: Any) -> None:
    print(escape_controls(json.dumps(doc, ensure_ascii=False, default=str)))
