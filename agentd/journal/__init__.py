"""The run journal: durable, append-only records of each run and the daemon's durable state.

One narrow interface (:class:`agentd.journal.store.JournalStore`) with one implementation today
(:mod:`agentd.journal.sqlite`, an embedded SQLite file under ``--state-dir``). This package is a leaf of the
run composition: it imports only the standard library, attrs, trio and ``agentd.errors``.

Nothing is imported here so that ``agentd journal`` and ``import agentd.journal.records`` stay cheap.
"""
