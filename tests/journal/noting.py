"""A journal file that notes how each entry was written: the ``synchronous`` setting of the connection that
inserted it (2 FULL: fsynced at its commit; 1 NORMAL: not), by a trigger on the real SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agentd.journal.sqlite import DB_NAME, open_journal

FULL, NORMAL = 2, 1


async def noting_journal(state: Path) -> None:
    """Create the journal in ``state`` as a root creates it, with a table ``seen (run_id, kind, sync)`` that a
    trigger fills with each inserted entry's run, kind and its writer's ``synchronous``, in insertion order."""
    async with open_journal(str(state)):
        pass
    with sqlite3.connect(state / DB_NAME) as conn:
        conn.execute("CREATE TABLE seen (run_id TEXT, kind TEXT, sync INTEGER)")
        conn.execute("CREATE TRIGGER note AFTER INSERT ON entries BEGIN "
                     "INSERT INTO seen SELECT new.run_id, new.kind, synchronous FROM pragma_synchronous; END")
