"""``agentd cluster migrate|status|submit|show``: operate the cluster database, one JSON document on stdout.

- ``migrate``: bring the schema to this agentd's version (forward only; a newer schema is refused, exit 2):
  ``{"database", "from", "to"}``.
- ``status``: the capacity signal for autoscalers and operators: members alive (capacity, running, heartbeat
  age), free slots, queued items, the oldest queued item's age.
- ``submit --instruction TEXT [--id ID] [--output-contract TEXT]``: enqueue a run as a work item any member
  may claim; ``{"handle": ID, "created": bool}`` (an existing ID is not enqueued twice).
- ``show HANDLE``: the item and its run as the shared journal has them (any member's work):
  ``{"handle", "status", "done", "owner", "attempts", "result"}``.

The DSN comes from ``--cluster`` or the daemon's environment names for it (``AGENTD_CLUSTER``); the password
from the standard PostgreSQL environment or a ``{{secret:NAME}}`` in the DSN, never printed.
Exit codes: 0 done, 1 no such handle, 2 usage or schema, 6 the database cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from agentd import defaults
from agentd.cluster.capacity import read_capacity
from agentd.cluster.store import PgJournal, open_database
from agentd.cluster.work import enqueue, view
from agentd.config.dsn import connect_args, parse
from agentd.errors import ConfigError
from agentd.formats.ids import new_run_id
from agentd.journal.recorder import rebuild
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import Redactor


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentd cluster", description="Operate the cluster database.")
    p.add_argument("command", choices=["migrate", "status", "submit", "show"])
    p.add_argument("handle", nargs="?")
    p.add_argument("--cluster", help="the cluster DSN (default: $AGENTD_CLUSTER)")
    p.add_argument("--instruction", help="submit: what the run should do")
    p.add_argument("--output-contract", help="submit: what the answer must look like")
    p.add_argument("--id", help="submit: the work item's id (default: a new run id)")
    p.add_argument("--lease-ttl", type=float, default=defaults.CLUSTER_LEASE_TTL,
                   help="status: members silent longer than this many seconds are not counted")
    p.add_argument("--json", action="store_true", help="print the JSON document even at a terminal")
    return p


def cluster_main(args: Sequence[str], env: Mapping[str, str] | None = None, *, dsn_envs: Sequence[str] = (),
                 human: Callable[[str, Any], None] | None = None) -> int:
    """``agentd cluster``; ``human`` draws the answer for a person (the CLI passes it when stdout is a terminal;
    ``--json`` keeps the JSON document)."""
    env = os.environ if env is None else env
    options = _parser().parse_args(list(args))
    text = options.cluster or next((env[n] for n in dsn_envs if env.get(n)), None)
    if not text:
        raise ConfigError("agentd cluster: no database (pass --cluster DSN or set AGENTD_CLUSTER)")
    if options.command == "submit" and not (options.instruction or "").strip():
        raise ConfigError("agentd cluster submit: --instruction is required")
    if options.command == "show" and not options.handle:
        raise ConfigError("agentd cluster show: HANDLE is required")
    dsn = parse(text)
    redactor = Redactor()
    conninfo, password = connect_args(dsn, SecretResolver(env=env, redactor=redactor), env, redactor)
    code, document = trio.run(_command, options, conninfo, password, str(dsn))
    if human is not None and not options.json:
        human(options.command, document)
        return code
    print(json.dumps(document, separators=(",", ":")))
    sys.stdout.flush()
    return code


async def _command(options: argparse.Namespace, conninfo: str, password: str | None, where: str
                   ) -> tuple[int, dict[str, Any]]:
    migrate = options.command == "migrate"
    if migrate:
        from agentd.cluster import migrations
        from agentd.cluster.db import Database

        plain = Database(conninfo, password, where)
        try:
            before, after = await plain.call(lambda c: migrations.check(c, where, migrate=True), "migrate")
        finally:
            await plain.aclose()
        return 0, {"database": where, "from": before, "to": after}
    store = PgJournal(await open_database(conninfo, password, where))
    try:
        if options.command == "status":
            signal = await read_capacity(store, options.lease_ttl)
            return 0, {"database": where, **signal.to_json()}
        if options.command == "submit":
            handle = options.id or new_run_id()
            payload: dict[str, Any] = {"instruction": options.instruction}
            if options.output_contract:
                payload["output_contract"] = options.output_contract
            created = await enqueue(store, handle, "run", payload)
            return 0, {"handle": handle, "created": created}
        seen = await view(store, options.handle)
        if seen is None:
            return 1, {"error": f"no work item {options.handle!r} in the cluster"}
        run = await store.read_run(options.handle)
        ended = rebuild(run).ended if run is not None else None
        body: dict[str, Any] = {"handle": seen.work_id, "kind": seen.kind,
                                "status": ended.status if ended is not None else ("queued" if seen.owner is None
                                                                                  else "running"),
                                "done": seen.status == "done", "owner": seen.owner, "attempts": seen.attempts}
        if ended is not None:
            recorded = ended.result if isinstance(ended.result, dict) else {}
            body["result"] = recorded.get("result")
            body["partial"] = bool(recorded.get("partial", False))
        return 0, body
    finally:
        await store.aclose()
