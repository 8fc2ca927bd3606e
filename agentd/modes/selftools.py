"""The in-loop self-scheduling tools: ``subscribe``, ``unsubscribe``, ``schedule`` and ``await_resource``.

``subscribe``/``unsubscribe``/``schedule`` change what the daemon does *after* the run, so they only
queue a request on the run's :class:`SelfRequests`; the daemon applies the queue when the run ends
(a run that is cancelled or crashes still has its queue applied: the agent asked). They answer
``isError`` only for an empty URI / instruction, an out-of-range delay, or an exceeded per-run cap,
and never look at the target server at call time.

``await_resource`` is different: it blocks inside the run until the next update of a URI satisfies
its condition (subscribing for the duration if nobody watches it yet) and returns the fresh contents,
or a timeout observation. It needs an :class:`Awaiter` (``agentd.modes.watch``).

A once run has no "after the run" (the process ends with it), so its ``subscribe`` (:func:`once_tools`) is
the in-run kind: it waits, subscribed for the duration, for the next update of the URI and returns the fresh
contents (``await_resource`` without a condition), bounded by ``timeout_s`` and the run's deadline. The once
run offers ``await_resource`` too, and neither ``unsubscribe`` nor ``schedule`` (nothing would apply them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, Protocol

import attrs

from agentd.agent.control import ControlContext, ControlResult, ControlTool, ControlToolRegistry, Handler
from agentd.modes.condition import OPS, Condition, ConditionError

MAX_SUBSCRIPTION_REQUESTS: Final = 16
MAX_SCHEDULES: Final = 8
MIN_AFTER_SECONDS: Final = 1.0
MAX_AFTER_SECONDS: Final = 30 * 24 * 3600.0
DEFAULT_AWAIT_TIMEOUT: Final = 60.0
MAX_AWAIT_TIMEOUT: Final = 3600.0


@attrs.frozen
class SubscriptionRequest:
    action: Literal["subscribe", "unsubscribe"]
    uri: str


@attrs.frozen
class ScheduleRequest:
    after_seconds: float
    instruction: str


@attrs.define(eq=False)
class SelfRequests:
    """What one run asked the daemon to do once it ends, in the order it asked."""

    subscriptions: list[SubscriptionRequest] = attrs.field(factory=list)
    schedules: list[ScheduleRequest] = attrs.field(factory=list)

    def __bool__(self) -> bool:
        return bool(self.subscriptions or self.schedules)


@attrs.frozen
class AwaitOutcome:
    """``contents`` is the fresh ``resources/read`` result, or None on timeout."""

    uri: str
    contents: Sequence[Mapping[str, Any]] | None
    waited_s: float
    updates_seen: int


class Awaiter(Protocol):
    async def await_resource(self, uri: str, condition: Condition | None, timeout: float) -> AwaitOutcome: ...


_URI_SCHEMA: Final = {"type": "string", "description": "a concrete resource URI on a declared MCP server"}
#: Module-level schemas: a daemon registers these tools afresh for every wake, and the loop's catalogue
#: reuses what it prepared for a schema object it has already seen (agentd.agent.catalogue).
_SUBSCRIPTION_SCHEMA: Final = {"type": "object", "properties": {"uri": _URI_SCHEMA}, "required": ["uri"],
                               "additionalProperties": False}
_SCHEDULE_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "after_seconds": {"type": "number", "minimum": MIN_AFTER_SECONDS, "maximum": MAX_AFTER_SECONDS},
        "instruction": {"type": "string"},
    },
    "required": ["after_seconds", "instruction"],
    "additionalProperties": False,
}
_AWAIT_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "uri": _URI_SCHEMA,
        "condition": {
            "type": "object",
            "properties": {
                "pointer": {"type": "string", "description": "RFC 6901 JSON Pointer, '' = whole content"},
                "op": {"type": "string", "enum": list(OPS)},
                "value": {},
            },
            "required": ["pointer", "op"],
        },
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_AWAIT_TIMEOUT,
                      "default": DEFAULT_AWAIT_TIMEOUT},
    },
    "required": ["uri"],
    "additionalProperties": False,
}


def _uri(arguments: Mapping[str, Any]) -> str | None:
    uri = arguments.get("uri")
    return uri.strip() if isinstance(uri, str) and uri.strip() else None


def _subscription_tool(action: Literal["subscribe", "unsubscribe"], requests: SelfRequests) -> ControlTool:
    async def handler(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        uri = _uri(arguments)
        if uri is None:
            return ControlResult.text(f"{action}: uri must be a non-empty string", is_error=True)
        if len(requests.subscriptions) >= MAX_SUBSCRIPTION_REQUESTS:
            return ControlResult.text(
                f"{action}: at most {MAX_SUBSCRIPTION_REQUESTS} subscribe/unsubscribe requests per run", is_error=True
            )
        requests.subscriptions.append(SubscriptionRequest(action, uri))
        when = "wake this agent when it changes" if action == "subscribe" else "stop waking this agent for it"
        return ControlResult.text(f"queued: after this run the daemon will {action} {uri} ({when})")

    verb = "Wake this agent whenever" if action == "subscribe" else "Stop waking this agent when"
    return ControlTool(
        name=action,
        description=f"{verb} the MCP resource `uri` changes. Applied after this run ends.",
        input_schema=_SUBSCRIPTION_SCHEMA,
        handler=handler,
    )


def _schedule_tool(requests: SelfRequests) -> ControlTool:
    async def handler(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        after, instruction = arguments.get("after_seconds"), arguments.get("instruction")
        if isinstance(after, bool) or not isinstance(after, int | float):
            return ControlResult.text("schedule: after_seconds must be a number", is_error=True)
        if not MIN_AFTER_SECONDS <= after <= MAX_AFTER_SECONDS:
            return ControlResult.text("schedule: after_seconds must be between 1 and 2592000 (30 days)",
                                      is_error=True)
        if not isinstance(instruction, str) or not instruction.strip():
            return ControlResult.text("schedule: instruction must be a non-empty string", is_error=True)
        if len(requests.schedules) >= MAX_SCHEDULES:
            return ControlResult.text(f"schedule: at most {MAX_SCHEDULES} schedules per run", is_error=True)
        requests.schedules.append(ScheduleRequest(float(after), instruction))
        return ControlResult.text(f"queued: a run with this instruction will start {after:g} s after this run")

    return ControlTool(
        name="schedule",
        description="Start a later run of this agent with `instruction`, `after_seconds` (1 s to 30 days) "
        "after this run ends.",
        input_schema=_SCHEDULE_SCHEMA,
        handler=handler,
    )


def _await_handler(awaiter: Awaiter, name: str = "await_resource") -> Handler:
    """The handler of ``await_resource`` (and of a once run's ``subscribe``, ``name`` in its messages)."""

    async def handler(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        uri = _uri(arguments)
        if uri is None:
            return ControlResult.text(f"{name}: uri must be a non-empty string", is_error=True)
        timeout = arguments.get("timeout_s", DEFAULT_AWAIT_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_AWAIT_TIMEOUT:
            return ControlResult.text(f"{name}: timeout_s must be in (0, {MAX_AWAIT_TIMEOUT:g}]",
                                      is_error=True)
        condition = None
        if arguments.get("condition") is not None:
            try:
                condition = Condition.from_arguments(arguments["condition"])
            except ConditionError as exc:
                return ControlResult.text(f"{name}: {exc}", is_error=True)
        outcome = await awaiter.await_resource(uri, condition, float(timeout))
        summary = {"uri": uri, "timed_out": outcome.contents is None, "waited_s": round(outcome.waited_s, 3),
                   "updates_seen": outcome.updates_seen}
        if outcome.contents is None:
            return ControlResult(
                ({"type": "text", "text": f"{name}: no matching update of {uri} within {timeout:g} s"},),
                structured=summary,
            )
        head = {"type": "text", "text": f"{name}: {uri} {'matched' if condition else 'updated'} after "
                f"{outcome.updates_seen} update(s), {outcome.waited_s:.3g} s; its current content:"}
        items = tuple(_content_item(uri, item) for item in outcome.contents)
        return ControlResult((head, *items) if items else (head, {"type": "text", "text": "(empty resource)"}),
                             structured=summary)

    return handler


def _await_tool(awaiter: Awaiter) -> ControlTool:
    return ControlTool(
        name="await_resource",
        description="Wait until the MCP resource `uri` is updated and its content satisfies `condition` "
        "(a JSON Pointer into the JSON content and an op), then return the fresh content; "
        "returns a timeout observation after `timeout_s` seconds.",
        input_schema=_AWAIT_SCHEMA,
        handler=_await_handler(awaiter),
    )


_ONCE_SUBSCRIBE_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "uri": _URI_SCHEMA,
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_AWAIT_TIMEOUT,
                      "default": DEFAULT_AWAIT_TIMEOUT},
    },
    "required": ["uri"],
    "additionalProperties": False,
}


def _once_subscribe_tool(awaiter: Awaiter) -> ControlTool:
    """``subscribe`` in a once run: wait here for the next update of ``uri`` and return what it is now."""
    wait = _await_handler(awaiter, "subscribe")

    async def handler(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        return await wait({key: arguments[key] for key in ("uri", "timeout_s") if key in arguments}, ctx)

    return ControlTool(
        name="subscribe",
        description="Wait until the MCP resource `uri` changes, then return its fresh content (this run "
        "is a once run: the subscription lasts for this call only, at most `timeout_s` seconds and the run's "
        "deadline; a timeout is an observation, not an error).",
        input_schema=_ONCE_SUBSCRIBE_SCHEMA,
        handler=handler,
    )


def once_tools(awaiter: Awaiter) -> list[ControlTool]:
    """A once run's self-tools: the in-run ``subscribe`` and ``await_resource``."""
    return [_once_subscribe_tool(awaiter), _await_tool(awaiter)]


def _content_item(uri: str, item: Mapping[str, Any]) -> Mapping[str, Any]:
    """A resource content item as a tool-result content block (an embedded resource)."""
    return {"type": "resource", "resource": dict(item) if "uri" in item else {"uri": uri, **item}}


def self_tools(requests: SelfRequests, awaiter: Awaiter | None = None) -> list[ControlTool]:
    """The tools for one run; ``await_resource`` only when there is something to await with."""
    tools = [
        _subscription_tool("subscribe", requests),
        _subscription_tool("unsubscribe", requests),
        _schedule_tool(requests),
    ]
    if awaiter is not None:
        tools.append(_await_tool(awaiter))
    return tools


def register_self_tools(registry: ControlToolRegistry, requests: SelfRequests,
                        awaiter: Awaiter | None = None) -> None:
    for tool in self_tools(requests, awaiter):
        registry.register(tool)
