"""``--cluster DSN``: open the shared journal, join as a member, and run claimed work.

Why here: the daemon (agentd.daemon) opens the cluster where it would open the SQLite journal, so every run
the daemon journals goes to the shared database, and starts :meth:`Cluster.serve` in its nursery with the
function that runs one claimed item (agentd.run, with the item's fenced journal). Start-up faults are
decided before anything runs: an unreachable database or a refused login is
:class:`~agentd.cluster.errors.ClusterUnavailable` (exit 6) naming ``host:port/database``; a newer schema
is :class:`~agentd.cluster.errors.ClusterSchemaError` (exit 2).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import attrs
import trio

from agentd.cluster.capacity import CapacityBoard
from agentd.cluster.db import Database
from agentd.cluster.member import Execute, Member
from agentd.cluster.store import PgJournal, open_database
from agentd.cluster.watch import DoneWatch
from agentd.cluster.work import Queue
from agentd.config.dsn import connect_args, parse
from agentd.config.model import Config
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog


def member_id() -> str:
    """Unique per process: host, pid and a random tag (a restarted member is a new member)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@attrs.define(eq=False)
class Cluster:
    store: PgJournal
    queue: Queue
    listen_db: Database
    ttl: float
    log: EventLog
    #: The served surface's waiters for cluster handles' ends (agentd.selfmcp.clustered).
    watch: DoneWatch = attrs.field(factory=DoneWatch)
    #: This member's slots and the last capacity read (``agentd ctl status``).
    board: CapacityBoard = attrs.field(default=attrs.Factory(lambda self: CapacityBoard(
        self.queue.member, self.queue.capacity), takes_self=True))

    async def serve(self, execute: Execute, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        member = Member(self.queue, execute, self.log, ttl=self.ttl, listen_db=self.listen_db, watch=self.watch,
                        board=self.board)
        await member.serve(task_status=task_status)


@asynccontextmanager
async def open_cluster(cfg: Config, log: EventLog, env: Mapping[str, str], *, address: str | None = None,
                       migrate: bool = False) -> AsyncIterator[Cluster]:
    """The cluster database for the block (schema checked; the password registered with the log's redactor)."""
    assert cfg.cluster.dsn is not None
    dsn = parse(cfg.cluster.dsn)
    conninfo, password = connect_args(dsn, SecretResolver(env=env, redactor=log.redactor), env, log.redactor)
    db = await open_database(conninfo, password, str(dsn), migrate=migrate)
    listen_db = Database(conninfo, password, str(dsn), application="agentd-listen")
    store = PgJournal(db, redactor=log.redactor)
    try:
        queue = Queue(store, member_id(), address, cfg.cluster.capacity)
        yield Cluster(store, queue, listen_db, cfg.cluster.lease_ttl, log)
    finally:
        await listen_db.aclose()
        await store.aclose()
