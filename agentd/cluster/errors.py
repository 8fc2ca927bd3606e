"""The cluster's errors, mapped to exit codes by the CLI (docs/cluster.md lists each message).

- :class:`ClusterUnavailable` (exit 6, like a required MCP server that cannot be reached): the database cannot
  be reached or refused the login. The message names the host, port and database, never the password.
- :class:`ClusterSchemaError` (exit 2): the database holds a schema from a newer agentd, or is not migrated
  and migrating was not asked for.
- :class:`LeaseLost` (a journal error, exit 1): a commit was refused because this member no longer holds the
  run's lease (another member claimed it: the fencing token moved on). Nothing of the commit is written.
"""

from __future__ import annotations

from agentd.errors import ConfigError, ExitCode
from agentd.journal.errors import JournalError


class ClusterUnavailable(JournalError):
    """The cluster database cannot be reached (or the login failed)."""

    exit_code = ExitCode.MCP_REQUIRED


class ClusterSchemaError(ConfigError):
    """The database's schema is newer than this agentd, or not an agentd schema."""


class LeaseLost(JournalError):
    """This member's lease on a run was lost: the commit was refused (fencing).

    ``work`` is the run (work item) id, ``token`` the lease that was lost, ``new_owner`` and ``new_token`` who
    holds the run now (``None``: nobody, the lease was released or the run is not leased)."""

    def __init__(self, message: str, *, work: str | None = None, token: int | None = None,
                 new_owner: str | None = None, new_token: int | None = None) -> None:
        super().__init__(message)
        self.work, self.token, self.new_owner, self.new_token = work, token, new_owner, new_token
