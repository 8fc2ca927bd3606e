"""What a supervisor holds right now, as one frozen value: for operators, tests and ``wait_until``.

The supervisor's own bookkeeping (its nodes, the fork server, the root's ledger) stays private and mutable;
:meth:`agentd.supervisor.supervisor.Supervisor.statistics` copies what can be observed into these values, so
a reader can hold a snapshot, compare two, or test a predicate against one without reaching into state that
changes under it. Nothing secret is in here: no payloads, no configuration, only handles, statuses and pids.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class NodeStatistics:
    """One subagent this supervisor started (live, or ended and still readable by handle)."""

    handle: str
    #: ``starting`` (spawned, not yet ready), ``running``, ``awaiting_turn`` (a warm session between
    #: messages), or the final ``completed`` / ``failed`` / ``cancelled``.
    status: str
    #: The child's process id (None when its process could not be started). Still set after it ended.
    pid: int | None
    #: The child said ``ready`` (its session is up and answering the control channel).
    ready: bool
    ended: bool
    warm: bool
    usage_tokens: int


@attrs.frozen
class SupervisorStatistics:
    handle: str
    draining: bool
    #: Every subagent this supervisor holds, in spawn order.
    nodes: tuple[NodeStatistics, ...]
    #: The fork server's process id while it is up (None: not started, gone, or children are re-exec'd).
    fork_server_pid: int | None
    #: At the root: every live handle of the whole tree (grandchildren included), as the ledger counts
    #: them. None below the root, whose admissions are decided up the channel.
    tree_live: frozenset[str] | None
    #: At the root: tokens the whole supervisor has accounted (None below the root).
    tokens_used: int | None

    def node(self, handle: str) -> NodeStatistics | None:
        return next((n for n in self.nodes if n.handle == handle), None)

    @property
    def live(self) -> tuple[NodeStatistics, ...]:
        return tuple(n for n in self.nodes if not n.ended)

    @property
    def live_pids(self) -> tuple[int, ...]:
        return tuple(n.pid for n in self.live if n.pid is not None)

    @property
    def counts(self) -> dict[str, int]:
        """How many nodes are in each status."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.status] = counts.get(n.status, 0) + 1
        return counts
