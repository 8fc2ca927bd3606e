"""What the self-MCP server needs from the supervisor: a small protocol, so either side can land first.

The supervisor satisfies :class:`SelfMcpBackend` by calling its one spawn chokepoint with
``Caller(origin=MANAGEMENT)`` and minting ``served.N`` handles; the server never spawns anything itself.
Tests use a backend that runs real trio tasks (tests/selfmcp/backend.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import attrs

# A served run as a peer sees it is the supervisor's one result shape; re-exported for backends.
from agentd.supervisor.node import RunView as RunView

#: Statuses after which a run never changes again.
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "partial", "refused", "budget_exhausted"})


@attrs.frozen
class ServedSpawn:
    """A ``subagent.spawn`` from a peer, already validated against the served input schema."""

    instruction: str
    output_contract: str | None = None
    tool_scope: tuple[str, ...] | None = None
    warm: bool = False
    detached: bool = False  # async: the peer wants the handle at once
    #: The principal spawning it (agentd.transport.tenancy); a backend that keeps handles keeps it too.
    owner: str = ""
    #: Asked for as an MCP task (agentd.selfmcp.tasks): a backend that keeps handles keeps that too.
    task: bool = False
    #: Told the handle as soon as the supervisor mints it (before the child logs a line).
    on_admitted: Callable[[str], None] | None = attrs.field(default=None, eq=False, repr=False)
    #: The model the child calls (``--models`` allows it); None: the agent's own.
    model: str | None = None


@attrs.frozen
class Refusal:
    """A cap or scope refusal: the peer gets ``isError: true`` with this text, never a crash, plus
    ``structuredContent: {refused: cap, retryable, retry_after_s}`` to act on without parsing the text."""

    reason: str
    #: The rule that refused (the supervisor's cap names, ``serve_max_spawns``, ``serve_max_warm``).
    cap: str = "refused"
    retryable: bool = False
    #: Seconds after which the same spawn may be admitted (0: as soon as a running spawn ends).
    retry_after: float = 0.0


class SelfMcpBackend(Protocol):
    """The supervisor, seen from the served socket (origin MANAGEMENT, handles ``served.N``)."""

    async def spawn(self, request: ServedSpawn) -> str | Refusal:
        """Start the run in the supervisor's own nursery and return its handle without waiting for it."""
        ...

    async def send(self, handle: str, message: str) -> Refusal | None:
        """Queue a message into a warm session; ``None`` is the ack."""
        ...

    def forget(self, handle: str) -> None:
        """The surface's retention ran out for an ended run: release whatever the backend keeps for it."""
        ...

    def view(self, handle: str) -> RunView | None:
        """The handle's current state, ``None`` when unknown to the supervisor."""
        ...

    async def wait(self, handle: str) -> RunView:
        """Return once the run is terminal (a warm session is terminal when it ends)."""
        ...

    async def wait_turns(self, handle: str, after: int) -> RunView:
        """Return once a warm session has answered more than ``after`` turns (its view then carries the
        latest turn's ``result`` and ``turns``), or once the run is terminal."""
        ...

    async def cancel(self, handle: str) -> RunView | None:
        """Request a graceful cancel (the kill ladder); ``None`` when the handle is unknown."""
        ...

    def counts(self) -> Mapping[str, int]:
        """Spawn counters for ``agent://status`` (e.g. spawned, running, completed, failed, refused)."""
        ...
