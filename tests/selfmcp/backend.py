"""A test backend: real trio tasks with real (or autojumped) delays standing in for the supervisor.

The instruction steers a run: ``sleep=0.2`` makes it take that long, ``fail`` ends it failed,
``refuse`` is refused at the chokepoint. Results echo the instruction so tests can check what came back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs
import trio

from agentd.selfmcp.backend import Refusal, RunView, ServedSpawn


@attrs.define(eq=False)
class _Run:
    handle: str
    spawn: ServedSpawn
    view: RunView
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)
    inbox: list[str] = attrs.field(factory=list)
    wake: trio.Event = attrs.field(factory=trio.Event)


class TaskBackend:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.runs: dict[str, _Run] = {}
        self.spawned: list[ServedSpawn] = []
        self.cancelled: list[str] = []
        self.forgotten: list[str] = []
        self._n = 0

    async def spawn(self, request: ServedSpawn) -> str | Refusal:
        if "refuse" in request.instruction:
            return Refusal("spawn refused: tool_scope names a server this agent does not have")
        await trio.sleep(0)
        self._n += 1
        handle = f"served.{self._n}"
        run = _Run(handle, request, RunView(handle, "running", False))
        self.runs[handle] = run
        self.spawned.append(request)
        self.nursery.start_soon(self._run, run)
        return handle

    async def _run(self, run: _Run) -> None:
        text = run.spawn.instruction
        match = re.search(r"sleep=([0-9.]+)", text)
        delay = float(match.group(1)) if match else 0.05
        with run.scope:
            if run.spawn.warm:
                while "end" not in run.inbox:
                    await run.wake.wait()
                    run.wake = trio.Event()
            else:
                # real time: the fake run's length ("sleep=N"); virtual in the autojump_clock tests
                await trio.sleep(delay)
            status = "failed" if "fail" in text else "completed"
            run.view = RunView(run.handle, status, True, False, {"echo": text, "messages": list(run.inbox)})
        if run.scope.cancelled_caught:
            run.view = RunView(run.handle, "cancelled", True, True, None)
        run.done.set()

    async def send(self, handle: str, message: str) -> Refusal | None:
        run = self.runs.get(handle)
        if run is None or not run.spawn.warm:
            return Refusal(f"{handle} is not a warm session")
        run.inbox.append(message)
        run.wake.set()
        return None

    def forget(self, handle: str) -> None:
        self.forgotten.append(handle)

    def view(self, handle: str) -> RunView | None:
        run = self.runs.get(handle)
        return run.view if run is not None else None

    async def wait(self, handle: str) -> RunView:
        run = self.runs[handle]
        await run.done.wait()
        return run.view

    async def wait_turns(self, handle: str, after: int) -> RunView:
        run = self.runs[handle]
        await run.done.wait()  # this backend's warm sessions answer only when they end
        return run.view

    async def cancel(self, handle: str) -> RunView | None:
        run = self.runs.get(handle)
        if run is None:
            return None
        self.cancelled.append(handle)
        run.scope.cancel()
        await run.done.wait()
        return run.view

    def counts(self) -> Mapping[str, int]:
        views = [r.view for r in self.runs.values()]
        return {
            "spawned": len(views),
            "running": sum(1 for v in views if not v.done),
            "completed": sum(1 for v in views if v.status == "completed"),
            "failed": sum(1 for v in views if v.status == "failed"),
            "cancelled": sum(1 for v in views if v.status == "cancelled"),
        }
