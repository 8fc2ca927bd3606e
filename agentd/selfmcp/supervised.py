"""The supervisor as a :class:`~agentd.selfmcp.backend.SelfMcpBackend`: every served call goes through
its one chokepoint with ``Caller(origin=MANAGEMENT)``, so caps, tool-scope narrowing and ``served.N``
handles are the supervisor's, exactly as for in-loop spawns.

A served spawn always starts detached in the supervisor's nursery (``async_`` or ``warm``) and the
surface waits for it: a legacy peer that drops its connection does not cancel the run (the spec's
rule; ``subagent.cancel`` is the path), while the modern wire cancels it explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from agentd.selfmcp.backend import Refusal, RunView, ServedSpawn
from agentd.supervisor.caps import Refusal as SupervisorRefusal
from agentd.supervisor.supervisor import Caller, Origin, SpawnRequest, Supervisor, is_terminal

MANAGEMENT = Caller(origin=Origin.MANAGEMENT)


@attrs.define(eq=False)
class SupervisorBackend:
    supervisor: Supervisor
    _spawned: int = 0
    _refused: int = 0

    async def spawn(self, request: ServedSpawn, *, journal_run: str | None = None) -> str | Refusal:
        """``journal_run``: the run id the child journals its own steps under (agentd.selfmcp.journaled)."""
        answer = await self.supervisor.spawn(MANAGEMENT, SpawnRequest(
            instruction=request.instruction,
            output_contract=request.output_contract,
            tool_scope=request.tool_scope,
            async_=not request.warm,
            warm=request.warm,
            on_admitted=request.on_admitted,
            journal_run=journal_run,
            model=request.model,
        ))
        if isinstance(answer, SupervisorRefusal):
            self._refused += 1
            return Refusal(answer.message, cap=answer.cap or "refused", retryable=answer.retryable,
                           retry_after=answer.retry_after)
        self._spawned += 1
        return answer.handle

    async def send(self, handle: str, message: str) -> Refusal | None:
        answer = await self.supervisor.send(MANAGEMENT, handle, message, wait=False)
        return Refusal(answer.message) if isinstance(answer, SupervisorRefusal) else None

    def forget(self, handle: str) -> None:
        self.supervisor.forget(MANAGEMENT, handle)

    def view(self, handle: str) -> RunView | None:
        answer = self.supervisor.status(MANAGEMENT, handle)
        return None if isinstance(answer, SupervisorRefusal) else answer

    async def wait(self, handle: str) -> RunView:
        while True:
            answer = await self.supervisor.await_(MANAGEMENT, handle, timeout=math.inf)
            if isinstance(answer, SupervisorRefusal):
                return RunView(handle, "failed", True, False, None)
            if is_terminal(answer):
                return answer
            await self.supervisor.wait_changed()  # a warm session between turns: wait for an end

    async def wait_turns(self, handle: str, after: int) -> RunView:
        answer = await self.supervisor.wait_turns(MANAGEMENT, handle, after)
        return RunView(handle, "failed", True, False, None) if isinstance(answer, SupervisorRefusal) else answer

    async def cancel(self, handle: str) -> RunView | None:
        answer = await self.supervisor.cancel(MANAGEMENT, handle, "cancelled by peer")
        return None if isinstance(answer, SupervisorRefusal) else answer

    def counts(self) -> Mapping[str, int]:
        live = [n for n in self.supervisor.live() if n.handle.startswith("served.")]
        return {"spawned": self._spawned, "refused": self._refused, "running": len(live)}
