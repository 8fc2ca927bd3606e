"""The journal's one narrow interface, :class:`JournalStore`, and the values that cross it.

Why a Protocol: the run composition talks to the journal only through these methods, so the embedded
SQLite store (:mod:`agentd.journal.sqlite`, one process) and a later shared store (PostgreSQL, several
daemons) are interchangeable. Every method is ``async`` and commits or reads in one transaction; an
implementation keeps blocking I/O off the trio thread.

- Runs: :meth:`append` commits a batch (one step) atomically and returns the last sequence number;
  a batch is either wholly in the journal or not at all. A run is *unfinished* until a
  :class:`~agentd.journal.records.RunEnded` is appended.
- Daemon state: :meth:`put_state` / :meth:`get_state` keep small JSON values by ``(namespace, key)``
  (subscriptions, schedules, served handles, the budget ledger).
- Retention: :meth:`prune` removes finished runs by a :class:`Retention` policy; unfinished runs are
  never pruned (recovery needs them).
- Ownership: :meth:`claim` / :meth:`renew` / :meth:`release` give a run to one owner for a lease with a
  fencing token. With one process (SQLite) they are bookkeeping; a shared store enforces them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import attrs

from agentd.defaults import JOURNAL_KEEP_FOR, JOURNAL_KEEP_RUNS
from agentd.errors import ConfigError
from agentd.journal.records import Record

#: Retention defaults (their home is agentd.defaults; ``--journal-keep-for``/``--journal-keep-runs``).
DEFAULT_KEEP_DAYS: Final = JOURNAL_KEEP_FOR / 86400
DEFAULT_KEEP_RUNS: Final = JOURNAL_KEEP_RUNS


#: The state namespace naming finished runs a live part still reads (a ``--continue`` session's turns: each turn
#: refers to the earlier ones): each key holds a list of run ids, and retention never removes those runs.
KEPT_RUNS: Final = "journal.kept_runs"


@attrs.frozen
class Retention:
    """Which finished runs to keep: those younger than ``keep_days`` AND among the ``keep_runs`` newest, and
    always those in ``keep`` (named under :data:`KEPT_RUNS`).

    ``None`` disables that bound. Unfinished runs are always kept.
    """

    keep_days: float | None = DEFAULT_KEEP_DAYS
    keep_runs: int | None = DEFAULT_KEEP_RUNS
    keep: frozenset[str] = frozenset()

    def __attrs_post_init__(self) -> None:
        if self.keep_days is not None and self.keep_days < 0:
            raise ConfigError(f"journal retention: keep_days must be >= 0, not {self.keep_days}")
        if self.keep_runs is not None and self.keep_runs < 0:
            raise ConfigError(f"journal retention: keep_runs must be >= 0, not {self.keep_runs}")

    @classmethod
    def of(cls, keep_for: float, keep_runs: int, kept: Mapping[str, Any] | None = None) -> Retention:
        """From the flags' values (``--journal-keep-for`` seconds, ``--journal-keep-runs``): 0 is no bound; and the
        :data:`KEPT_RUNS` state (anything but lists of run ids in it is ignored)."""
        keep = frozenset(run_id for ids in (kept or {}).values() if isinstance(ids, list)
                         for run_id in ids if isinstance(run_id, str))
        return cls(keep_days=keep_for / 86400 if keep_for else None, keep_runs=keep_runs or None, keep=keep)


@attrs.frozen
class Entry:
    """One committed record of a run: its sequence number in the run (from 0) and commit time."""

    seq: int
    ts: float
    record: Record


@attrs.frozen
class RunSummary:
    run_id: str
    status: str  # "running" until the run's RunEnded is committed, then its status
    started_at: float
    ended_at: float | None
    parent: str | None
    records: int


@attrs.frozen
class RunJournal:
    summary: RunSummary
    entries: tuple[Entry, ...]


@attrs.frozen
class Lease:
    """Ownership of a run until ``expires_at`` (wall clock). ``token`` grows with every claim (fencing)."""

    run_id: str
    owner: str
    token: int
    expires_at: float


class JournalStore(Protocol):
    """The journal as the run composition sees it (see the module docstring)."""

    async def append(self, run_id: str, records: Sequence[Record], *, durable: bool = False) -> int:
        """Commit ``records`` to ``run_id`` in one transaction; return the last record's sequence number.

        ``durable`` makes the commit survive a crash of the store itself (power loss under SQLite, a crash of
        the PostgreSQL server) before this returns, and with it every commit made before it (both stores write
        one log in commit order). The recorder sets it for what agentd acts on outside the journal next
        (agentd.journal.recorder), ``RunEnded`` included unless a parent run commits that end itself. Concurrent appends may share one
        transaction (agentd.journal.group); each batch is still wholly in the journal or not at all.
        """
        ...

    async def read_run(self, run_id: str) -> RunJournal | None: ...

    async def list_runs(self, *, limit: int = 50, status: str | None = None) -> list[RunSummary]:
        """Most recently started first."""
        ...

    async def unfinished_runs(self) -> list[RunSummary]:
        """Runs with no ``RunEnded`` (what recovery looks at after a restart), oldest first."""
        ...

    async def get_state(self, namespace: str) -> dict[str, Any]: ...

    async def put_state(self, namespace: str, changes: Mapping[str, Any]) -> None:
        """Set each key to its JSON value (``None`` deletes it), all in one durable transaction."""
        ...

    async def prune(self, retention: Retention, *, now: float | None = None) -> int:
        """Remove finished runs outside ``retention``; return how many were removed."""
        ...

    async def claim(self, run_id: str, owner: str, *, ttl: float) -> Lease | None:
        """Take ``run_id`` for ``owner`` for ``ttl`` seconds; None if another owner's lease is live."""
        ...

    async def renew(self, lease: Lease, *, ttl: float) -> Lease | None:
        """Extend ``lease``; None if it was lost (expired and claimed by someone else)."""
        ...

    async def release(self, lease: Lease) -> None: ...

    async def aclose(self) -> None: ...
