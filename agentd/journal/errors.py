"""The journal's errors, all :class:`~agentd.errors.AgentdError` so the CLI maps them to exit codes.

- :class:`JournalError` (exit 1): the store could not be read or written (disk full, I/O error, locked).
- :class:`JournalFormatError` (exit 1): a stored record this agentd cannot read.
- :class:`JournalSchemaError` (exit 2): the file is not a journal or was written by a newer agentd;
  raised when the store is opened, before anything is written.

Messages name the file and the SQLite error, never a record's content.
"""

from __future__ import annotations

from agentd.errors import AgentdError, ConfigError


class JournalError(AgentdError):
    """The journal store failed to read or commit."""


class JournalFormatError(JournalError):
    """A stored record this agentd cannot read (unknown kind, newer version, malformed fields)."""


class JournalSchemaError(ConfigError):
    """The journal on disk is not a journal or was written by a newer agentd: refused before any write."""
