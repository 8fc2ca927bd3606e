"""In-process stand-ins for the loop's two dependencies, for tests that own time (autojump clock) or
need exact control of replies. The loop itself runs for real; end-to-end tests use real peers instead.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from agentd.client.models import ResourceContents, ResourceInfo, ToolInfo, ToolResult
from agentd.errors import ResourceNotFound
from agentd.intelligence.wire import ChatTool, ModelReply, ToolCall, Usage

Reply = ModelReply | Callable[[list[dict[str, Any]]], ModelReply] | Exception


def call(name: str, arguments: Any = None, call_id: str | None = None) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCall(call_id or f"c-{name}", name, text)


def tools_reply(*calls: ToolCall, content: str | None = None, tokens: int = 10) -> ModelReply:
    return ModelReply(content, tuple(calls), Usage(tokens, 1), "tool_calls")


def final(text: str, tokens: int = 10, finish: str = "stop") -> ModelReply:
    return ModelReply(text, (), Usage(tokens, 1), finish)


@attrs.define(eq=False)
class ScriptedModel:
    """Replays ``replies`` in order (the last one repeats); records each request."""

    replies: list[Reply]
    requests: list[tuple[list[dict[str, Any]], list[ChatTool]]] = attrs.field(factory=list)
    model: str = "scripted"
    usage: Usage = attrs.field(factory=Usage)

    async def complete(self, messages: list[dict[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        self.requests.append((copy.deepcopy(messages), list(tools)))
        reply = self.replies[min(len(self.requests) - 1, len(self.replies) - 1)]
        await trio.lowlevel.checkpoint()
        if isinstance(reply, Exception):
            raise reply
        return reply(messages) if callable(reply) else reply


Handler = Callable[[Mapping[str, Any]], Awaitable[ToolResult]]


def text_result(text: str, *, is_error: bool = False) -> ToolResult:
    return ToolResult([{"type": "text", "text": text}], is_error)


@attrs.define(eq=False)
class MemoryPool:
    """A pool of in-memory servers: ``handlers[(server, tool)]``; records every call with its run id and key."""

    handlers: dict[tuple[str, str], Handler] = attrs.field(factory=dict)
    schemas: dict[tuple[str, str], dict[str, Any]] = attrs.field(factory=dict)
    resource_list: list[ResourceInfo] = attrs.field(factory=list)
    bodies: dict[tuple[str, str], str] = attrs.field(factory=dict)
    instruction_texts: dict[str, str] = attrs.field(factory=dict)
    annotations: dict[tuple[str, str], dict[str, Any]] = attrs.field(factory=dict)
    calls: list[tuple[str, str, dict[str, Any], str]] = attrs.field(factory=list)
    #: The idempotency key of each call in ``calls``, in the same order.
    keys: list[str] = attrs.field(factory=list)
    reads: list[tuple[str, str | None]] = attrs.field(factory=list)
    servers: tuple[str, ...] = ("s",)

    @property
    def connections(self) -> dict[str, Any]:
        return {name: object() for name in self.servers}

    def add(self, server: str, tool: str, handler: Handler, schema: dict[str, Any] | None = None,
            annotations: dict[str, Any] | None = None) -> None:
        self.handlers[(server, tool)] = handler
        self.schemas[(server, tool)] = schema or {"type": "object", "properties": {}}
        if annotations is not None:
            self.annotations[(server, tool)] = annotations

    def tools(self) -> list[ToolInfo]:
        return [ToolInfo(s, t, f"tool {t}", self.schemas[(s, t)], annotations=self.annotations.get((s, t)))
                for (s, t) in self.handlers]

    def resources(self) -> list[ResourceInfo]:
        return list(self.resource_list)

    def instructions(self) -> dict[str, str]:
        return dict(self.instruction_texts)

    async def call_tool(self, server: str, tool: str, arguments: Mapping[str, Any], *, run_id: str,
                        idempotency_key: str, resume_task: str | None = None, on_task: Any = None) -> ToolResult:
        self.calls.append((server, tool, dict(arguments), run_id))
        self.keys.append(idempotency_key)
        return await self.handlers[(server, tool)](arguments)

    async def read_resource(self, uri: str, server: str | None = None) -> ResourceContents:
        self.reads.append((uri, server))
        await trio.lowlevel.checkpoint()
        for (s, u), body in self.bodies.items():
            if u == uri and server in (None, s):
                return ResourceContents(s, uri, [{"uri": uri, "mimeType": "text/plain", "text": body}])
        raise ResourceNotFound(uri, -32002, "Resource not found", server=server)
