"""The cluster: several agentd daemons sharing one PostgreSQL journal and work queue (``--cluster DSN``).

- :mod:`agentd.config.dsn` (in config, validated with the other flags): the DSN as configured
  (secret-free), resolved at connect time, and named in messages without its password;
- :mod:`agentd.cluster.db`: one psycopg connection driven from trio through one bounded worker thread;
- :mod:`agentd.cluster.migrations`: the versioned, forward-only schema;
- :mod:`agentd.cluster.store`: the :class:`~agentd.journal.store.JournalStore` on PostgreSQL, with fenced
  appends (a run's commits are refused once its owner lost its lease);
- :mod:`agentd.cluster.work`: members (register, heartbeat) and work items claimed with
  ``FOR UPDATE SKIP LOCKED`` under leases with fencing tokens.
- :mod:`agentd.cluster.subscriptions`: subscriptions owned by one member at a time (lease rows, fenced wake
  records); the owner loop that watches them is agentd.modes.clustered.

Nothing is imported here: psycopg is loaded only by a daemon started with ``--cluster``.
"""
