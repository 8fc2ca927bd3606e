"""Served MCP tasks: what a served handle looks like as a task, on either wire.

Why it exists: a requestor that asks ``tools/call`` for a *task* (``params.task``, SEP-1686) wants an answer at
once and the outcome later. agentd already has exactly that: an async ``subagent.spawn`` returns a served
handle at once, and the handle's status, await and cancel exist. So a served task *is* a served handle (the
task id is the handle, ``served.N``): it belongs to the principal that spawned it, it is journaled with the
handle (``--state-dir``), and it answers after a restart. This module only decides the wire shapes, as data:
the capability, the tool's ``execution``, a run's task status, and the task object. The surface
(agentd.selfmcp.surface) does the rest with the handle machinery it already has.

The 2026-07-28 wire speaks the tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663) by default, as
extensions are negotiated per request there: a sync ``subagent.spawn`` from a request that declares the
extension is answered ``resultType: "task"``; ``tasks/get`` carries the result inline once it ended.

The 2025-11-25 wire is off by default: without ``--serve-tasks`` the served capability set on the 2025-11-25 wire stays exactly
``tools`` and ``resources.subscribe`` and ``params.task`` is ignored (the call runs as it always did), which
is what the specification asks of a server that does not declare tasks for a request.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final

from agentd.mcp import meta
from agentd.mcp.tasks import EXTENSION, TERMINAL

#: ``capabilities.tasks`` of a server that runs ``tools/call`` as tasks, lists and cancels them.
CAPABILITY: Final[dict[str, Any]] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
#: The one served tool that may run as a task.
TASK_TOOL: Final = "subagent.spawn"
#: ``_meta`` key tying a ``tasks/result`` to its task.
RELATED_TASK: Final = "io.modelcontextprotocol/related-task"
#: A run status that is not terminal reads ``working``; these terminal ones map to their task status, and every
#: other terminal one (failed, refused, budget_exhausted, lost, interrupted) is ``failed``.
_ENDED_AS: Final = {"completed": "completed", "partial": "completed", "cancelled": "cancelled"}


def tools_with_support(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The served tool list with ``subagent.spawn`` declaring ``execution.taskSupport: "optional"``."""
    return [{**tool, "execution": {"taskSupport": "optional"}} if tool["name"] == TASK_TOOL else tool
            for tool in tools]


def task_status(status: str, done: bool) -> str:
    """A served run's status as a task status."""
    if not done:
        return "working"
    return _ENDED_AS.get(status, "failed")


def iso(wall: float) -> str:
    """A wall-clock time as the ISO 8601 ``createdAt``/``lastUpdatedAt`` want it."""
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).isoformat().replace("+00:00", "Z")


def task(handle: str, status: str, done: bool, *, created: float, updated: float, ttl_s: float,
         poll_s: float) -> dict[str, Any]:
    """The 2025-11-25 ``Task`` for one served handle (``ttl``: how long an ended handle still answers)."""
    state = task_status(status, done)
    body: dict[str, Any] = {"taskId": handle, "status": state, "createdAt": iso(created),
                            "lastUpdatedAt": iso(updated), "ttl": int(ttl_s * 1000),
                            "pollInterval": int(poll_s * 1000)}
    if done and state != status:
        body["statusMessage"] = f"the subagent ended {status}"
    return body


def requested(params: Mapping[str, Any]) -> bool:
    """Does a ``tools/call`` ask to run as a task (``params.task`` an object)?"""
    return isinstance(params.get("task"), Mapping)


def task_id(params: Mapping[str, Any]) -> str | None:
    value = params.get("taskId")
    return value if isinstance(value, str) and value else None


def terminal(status: str) -> bool:
    return status in TERMINAL


def with_related(result: Mapping[str, Any], handle: str) -> dict[str, Any]:
    """``tasks/result``: the call's own result, tied to its task in ``_meta``."""
    meta = dict(result.get("_meta") or {})
    meta[RELATED_TASK] = {"taskId": handle}
    return {**result, "_meta": meta}


#: The modern wire's ``server/discover`` capabilities add the extension.
MODERN_CAPABILITY: Final[dict[str, Any]] = {EXTENSION: {}}
#: The extension's methods agentd answers (no ``tasks/list`` or ``tasks/result`` in it).
MODERN_METHODS: Final = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})


def declares_extension(params: Mapping[str, Any]) -> bool:
    """Does a modern request declare the tasks extension in its per-request client capabilities?"""
    envelope = params.get("_meta")
    caps = envelope.get(meta.CLIENT_CAPABILITIES) if isinstance(envelope, Mapping) else None
    extensions = caps.get("extensions") if isinstance(caps, Mapping) else None
    return isinstance(extensions, Mapping) and isinstance(extensions.get(EXTENSION), Mapping)


def modern_wanted(params: Mapping[str, Any]) -> bool:
    """A modern ``tools/call`` agentd answers with a task: a sync ``subagent.spawn`` (neither ``async`` nor
    ``warm``: those answer at once already) from a requestor that declares the extension."""
    arguments = params.get("arguments")
    if params.get("name") != TASK_TOOL or not declares_extension(params):
        return False
    return not isinstance(arguments, Mapping) or not (arguments.get("async") or arguments.get("warm"))


def modern_task(handle: str, status: str, done: bool, result: Mapping[str, Any] | None, *, created: float,
                updated: float, ttl_s: float, poll_s: float) -> dict[str, Any]:
    """The extension's task for one served handle: every end but ``cancelled`` is ``completed``, with exactly
    the CallToolResult a sync spawn answers inline (a run that ended ``failed`` is a tool result, not an error)."""
    state = "working" if not done else "cancelled" if status == "cancelled" else "completed"
    body: dict[str, Any] = {"taskId": handle, "status": state, "createdAt": iso(created),
                            "lastUpdatedAt": iso(updated), "ttlMs": int(ttl_s * 1000),
                            "pollIntervalMs": int(poll_s * 1000)}
    if state == "completed" and result is not None:
        body["result"] = dict(result)
    return body
