"""Control tools: the one seam through which agentd's own primitives reach the model.

The loop offers two kinds of tools: MCP tools from declared servers, and *control tools* that act on
agentd itself (``resource.read`` here; ``subagent.*``, ``subscribe``, ``schedule``, ``await_resource``,
``graph.*`` from the supervisor and reactive parts). Those parts register a :class:`ControlTool` in the
run's :class:`ControlToolRegistry`; the loop validates arguments against ``input_schema``, calls the
handler and feeds its :class:`ControlResult` back like any tool result. The loop never names a
control tool, so adding one never touches the loop.

A registry belongs to one run (no global state); build a fresh one per run.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from agentd.telemetry.events import EventLog

if TYPE_CHECKING:
    from agentd.journal.recorder import OpenChild

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
#: Names already checked against ``_NAME``: every run registers the same few tools again (bounded all the same).
_CHECKED: set[str] = set()
_CHECKED_MAX = 1024


@runtime_checkable
class ChildJournal(Protocol):
    """Where a run's subagents are journaled (agentd.journal.recorder.RunRecorder, with ``--state-dir``)."""

    #: The run started in this process (not resumed): no child of it is journaled yet.
    new: bool

    async def spawned(self, step: int, handle: str, instruction: str, budget: int | None,
                      run: str | None = None, warm: bool = False, ended: tuple[str, Any] | None = None) -> None: ...

    async def child_ended(self, handle: str, status: str, result: Any) -> None: ...

    def journaled_children(self) -> tuple[str, ...]:
        """Handles an earlier process of this run spawned (new ones are numbered after them)."""
        ...

    def earlier_end(self, handle: str) -> tuple[str, str] | None:
        """Status and result of a child an earlier process of this run left running (``lost``, a warm session
        ``interrupted``), or None."""
        ...

    def resumable_children(self) -> tuple[OpenChild, ...]:
        """The async children an earlier process of this run left running that resume under their handles
        (handed out once)."""
        ...

    def child_of_run(self, run: str) -> str | None:
        """The handle an earlier process of this run gave the child journaling ``run``, or None."""
        ...

    async def lost(self, handles: Sequence[str], warm: frozenset[str] = frozenset(), reason: str = "") -> None:
        """Record children an earlier process left running that do not continue (``reason``: why not)."""
        ...


@attrs.frozen
class ControlContext:
    """What a handler may know about the call: the run, its log (bound to the run) and the step, and where
    the run journals its subagents (None: not journaled)."""

    run_id: str
    log: EventLog
    step: int
    journal: ChildJournal | None = None
    #: The model's id of this call (with ``run_id`` and ``step``, what names a journaled child's own run).
    call_id: str = ""


@attrs.frozen
class ControlResult:
    """A control tool's answer, shaped like an MCP ``tools/call`` result.

    ``is_error`` results are observations the model reasons about (a refused spawn, a bad URI), exactly
    like an MCP ``isError``. ``end_turn`` asks the loop to end this run after the observation is
    recorded (``await_resource``: the session re-enters when the condition holds).
    """

    content: tuple[Mapping[str, Any], ...]
    is_error: bool = False
    structured: Mapping[str, Any] | None = None
    end_turn: bool = False

    @classmethod
    def text(cls, text: str, *, is_error: bool = False, end_turn: bool = False) -> ControlResult:
        return cls(({"type": "text", "text": text},), is_error=is_error, end_turn=end_turn)


Handler = Callable[[Mapping[str, Any], ControlContext], Awaitable[ControlResult]]
#: Continues, for a resumed journaled run, what an earlier process of it left running (ControlToolRegistry).
Resumer = Callable[[ChildJournal], Awaitable[None]]


@attrs.frozen
class ControlTool:
    """A built-in tool. ``name`` uses dots for namespaces (``subagent.spawn``); the wire name is derived."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    handler: Handler
    #: Whether a call with these arguments whose outcome a crash lost is *resumed* by making it again, not
    #: repeated (a synchronous ``subagent.spawn``: its child journals its own run under a name derived from the
    #: call, so the second call continues or replays that run). Asked only of a journaled run; None: never.
    resumes: Callable[[Mapping[str, Any]], bool] | None = None

    def __attrs_post_init__(self) -> None:
        if self.name in _CHECKED:
            return
        if not _NAME.match(self.name):
            raise ValueError(f"control tool name {self.name!r} must match {_NAME.pattern}")
        if len(_CHECKED) < _CHECKED_MAX:
            _CHECKED.add(self.name)


class ControlToolRegistry:
    """The control tools one run offers, in registration order. (A plain class: a once run builds it at start-up, where an attrs class costs about a millisecond of CPU.)"""

    __slots__ = ("_resumers", "_tools")

    def __init__(self, tools: dict[str, ControlTool] | None = None) -> None:
        self._tools: dict[str, ControlTool] = {} if tools is None else tools
        self._resumers: list[Resumer] = []

    def on_resume(self, resumer: Resumer) -> None:
        """Have ``resumer`` continue what a tool of this registry left running when its journaled run is
        resumed (the ``subagent.*`` tools resume the run's async children), before the loop starts."""
        self._resumers.append(resumer)

    async def resume(self, journal: ChildJournal) -> None:
        """A journaled run is resumed: each resumer continues its part, in registration order."""
        for resumer in self._resumers:
            await resumer(journal)

    def register(self, tool: ControlTool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"control tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def unregister(self, name: str) -> None:
        self._tools.pop(name, None)

    def get(self, name: str) -> ControlTool | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[ControlTool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools
