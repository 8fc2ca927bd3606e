"""In-process stand-ins for the *neighbours* of the code under test (the MCP pool, the model).

The drivers, router, watcher and self-tools under test are real; only what they talk to is replaced
here so timing tests can run on trio's autojump clock. End-to-end tests use the real pool, real
servers and the scripted HTTP gateway instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from agentd.agent.budgets import Limits
from agentd.agent.control import ControlToolRegistry
from agentd.agent.result import RunResult, RunStatus
from agentd.client.models import ResourceContents, ResourceUpdated
from agentd.errors import McpTransportError, ResourceNotFound
from agentd.intelligence.wire import ChatTool, ModelReply, ToolCall, Usage
from agentd.modes.runs import Job


@attrs.define(eq=False)
class MemoryPool:
    """Resources in a dict; ``bump`` changes one and notifies if it is subscribed (like a server would)."""

    push: bool = True  # False: the "server" has no resources.subscribe
    state: dict[str, str] = attrs.field(factory=dict)
    subscribed: set[str] = attrs.field(factory=set)
    calls: list[tuple[str, str]] = attrs.field(factory=list)
    reads: int = 0
    down: bool = False
    connections: dict[str, Any] = attrs.field(factory=lambda: {"mem": None})
    _send: trio.MemorySendChannel[ResourceUpdated] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[ResourceUpdated] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[ResourceUpdated](float("inf"))

    def tools(self) -> list[Any]:
        return []

    def resources(self) -> list[Any]:
        return []

    def instructions(self) -> dict[str, str]:
        return {}

    async def call_tool(self, server: str, tool: str, arguments: Mapping[str, Any], *, run_id: str,
                        idempotency_key: str, resume_task: str | None = None, on_task: Any = None) -> Any:
        raise AssertionError("no tools here")

    async def read_resource(self, uri: str, server: str | None = None) -> ResourceContents:
        await trio.sleep(0)
        self.reads += 1
        if self.down:
            raise McpTransportError("connection refused", server="mem")
        if uri not in self.state:
            raise ResourceNotFound(uri, -32002, "not found", server="mem")
        return ResourceContents("mem", uri, [{"uri": uri, "mimeType": "text/plain", "text": self.state[uri]}])

    async def subscribe(self, uri: str, server: str | None = None) -> bool:
        self.calls.append(("subscribe", uri))
        if not self.push:
            return False
        self.subscribed.add(uri)
        return True

    async def unsubscribe(self, uri: str, server: str | None = None) -> None:
        self.calls.append(("unsubscribe", uri))
        self.subscribed.discard(uri)

    def updates(self) -> trio.MemoryReceiveChannel[ResourceUpdated]:
        return self._receive

    def bump(self, uri: str, text: str) -> None:
        self.state[uri] = text
        if uri in self.subscribed:
            self._send.send_nowait(ResourceUpdated("mem", uri))


Script = Callable[[Sequence[Mapping[str, Any]], Sequence[ChatTool]], ModelReply]


def final(text: str = "done", tokens: int = 10) -> ModelReply:
    return ModelReply(text, (), Usage(tokens // 2, tokens - tokens // 2), "stop")


def call(name: str, arguments: Mapping[str, Any], tokens: int = 10, call_id: str = "c1") -> ModelReply:
    return ModelReply(None, (ToolCall(call_id, name, json.dumps(arguments)),), Usage(tokens // 2, tokens - tokens // 2),
                      "tool_calls")


@attrs.define(eq=False)
class ScriptedModel:
    """A model whose replies come from ``script(messages, tools)``; it records each request's time and text."""

    script: Script = lambda messages, tools: final()
    delay: float = 0.0
    requests: list[tuple[float, str]] = attrs.field(factory=list)

    async def complete(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        self.requests.append((trio.current_time(), str(messages[-1].get("content") or "")))
        if self.delay:
            await trio.sleep(self.delay)  # virtual time: the model's think time; its tests run on autojump_clock
        return self.script(messages, tools)


def first_user(messages: Sequence[Mapping[str, Any]]) -> str:
    return next(str(m["content"]) for m in messages if m["role"] == "user")


def tool_names(tools: Sequence[ChatTool]) -> set[str]:
    return {t.name for t in tools}


@attrs.define(eq=False)
class TimedJobs:
    """A RunJob that takes ``duration`` seconds and reports ``status``/``tokens`` (for driver timing tests)."""

    duration: float = 1.0
    status: RunStatus | Callable[[int], RunStatus] = RunStatus.COMPLETED
    tokens: int = 0
    started: list[tuple[float, Job, str, Limits]] = attrs.field(factory=list)

    async def __call__(self, job: Job, run_id: str, controls: ControlToolRegistry, limits: Limits) -> RunResult:
        from agentd.agent.result import RunUsage

        self.started.append((trio.current_time(), job, run_id, limits))
        await trio.sleep(self.duration)  # virtual time: a run's length; its tests run on autojump_clock
        status = self.status(len(self.started)) if callable(self.status) else self.status
        return RunResult(run_id=run_id, status=status, usage=RunUsage(self.tokens, 0))

    @property
    def times(self) -> list[float]:
        return [round(t, 6) for t, _, _, _ in self.started]
