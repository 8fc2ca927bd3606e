"""Calling a server's tools as tasks, as a requestor: which calls become tasks, and what each answer means.

Why it exists: a server may run a tool call as a durable *task* (a handle the client polls) instead of
answering it at once, and a tool whose ``execution.taskSupport`` is ``required`` cannot be called any other
way. agentd speaks both shapes, as data decided here and sent by the client (agentd.client.tasks):

* **2025-11-25 (SEP-1686, experimental, in core).** A requestor needs no client capability, so the handshake
  stays ``capabilities: {}``. A tool whose ``taskSupport`` is ``required`` is called with ``params.task {ttl}``
  (only when the server declares ``capabilities.tasks.requests.tools.call``; otherwise the tool cannot be
  called and is not offered); ``optional`` and ``forbidden`` tools are called plainly. The answer is a
  ``CreateTaskResult`` (``{task: {...}}``); agentd polls ``tasks/get`` at the server's ``pollInterval`` until
  the task is terminal (or asks for input), then fetches the outcome with ``tasks/result``.
* **2026-07-28 (extension ``io.modelcontextprotocol/tasks``, SEP-2663).** Every ``tools/call`` and ``tasks/*``
  request declares the extension in its per-request client capabilities; the server alone decides whether
  to answer ``resultType: "task"`` (the task inline). agentd polls ``tasks/get`` at ``pollIntervalMs``; the
  terminal task carries the ``result`` (or the JSON-RPC ``error``) inline. An ``input_required`` task is
  answered with ``tasks/update`` where agentd can answer (the refusals of agentd.mcp.input_required), once per
  request key.

Either way a task abandoned before its end (cancellation, the call timeout, the run's deadline) gets a
``tasks/cancel``: :func:`cancel_params` says whether one may be sent. No I/O here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

import attrs

from agentd.mcp.client_session import ResultTypeError
from agentd.mcp.input_required import answer
from agentd.mcp.meta import TASKS_EXTENSION as EXTENSION
from agentd.mcp.versions import Era

__all__ = ["EXTENSION"]
#: Statuses after which a task never changes.
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})
STATUSES: Final = TERMINAL | {"working", "input_required"}


class CallMode(enum.Enum):
    """How one tool is called on this connection."""

    PLAIN = "plain"  # an ordinary tools/call (a modern server may still answer with a task)
    TASK = "task"  # a 2025-11-25 task-augmented tools/call
    UNUSABLE = "unusable"  # taskSupport required, but the server cannot run tool calls as tasks


def task_support(execution: Any) -> str:
    """A tool's ``execution.taskSupport`` (``forbidden`` when absent or not understood)."""
    value = execution.get("taskSupport") if isinstance(execution, Mapping) else None
    return value if value in ("required", "optional") else "forbidden"


def legacy_tool_tasks(capabilities: Mapping[str, Any]) -> bool:
    """Does a 2025-11-25 server run ``tools/call`` as tasks (``capabilities.tasks.requests.tools.call``)?"""
    tasks = capabilities.get("tasks")
    requests = tasks.get("requests") if isinstance(tasks, Mapping) else None
    tools = requests.get("tools") if isinstance(requests, Mapping) else None
    return isinstance(tools, Mapping) and isinstance(tools.get("call"), Mapping)


def legacy_can_cancel(capabilities: Mapping[str, Any]) -> bool:
    tasks = capabilities.get("tasks")
    return isinstance(tasks, Mapping) and isinstance(tasks.get("cancel"), Mapping)


def call_mode(era: Era | None, support: str, capabilities: Mapping[str, Any]) -> CallMode:
    """How to call a tool with ``support`` (its ``taskSupport``) on a server with ``capabilities``.

    ``optional`` tools are called plainly on the 2025-11-25 wire: that keeps what goes over it by default
    exactly what it was before agentd spoke tasks."""
    if era is Era.MODERN or support != "required":
        return CallMode.PLAIN
    return CallMode.TASK if legacy_tool_tasks(capabilities) else CallMode.UNUSABLE


def pushes_status(capabilities: Mapping[str, Any]) -> bool:
    """Can a 2026-07-28 server be asked for ``notifications/tasks`` (``subscriptions/listen`` with ``taskIds``)?
    Only one that declares the extension in ``server/discover``."""
    extensions = capabilities.get("extensions")
    return isinstance(extensions, Mapping) and isinstance(extensions.get(EXTENSION), Mapping)


#: The status notifications a server may push: the extension's (SEP-2663, on ``subscriptions/listen``) and the
#: 2025-11-25 experimental tasks' (on whatever stream the server uses). Each carries the task, ``taskId`` first.
STATUS_NOTIFICATIONS: Final = frozenset({"notifications/tasks", "notifications/tasks/status"})


def unusable_reason() -> str:
    return ("its execution.taskSupport is 'required', but the server does not declare "
            "capabilities.tasks.requests.tools.call")


def augment(params: Mapping[str, Any], ttl_ms: int) -> dict[str, Any]:
    """A 2025-11-25 ``tools/call``'s params, task-augmented."""
    return {**params, "task": {"ttl": ttl_ms}}


@attrs.frozen
class Task:
    """One observation of a task (either wire's shape, normalized)."""

    task_id: str
    status: str
    status_message: str | None = None
    #: The server's suggested poll interval, seconds (None when it gave none).
    poll_interval: float | None = None
    #: 2026-07-28: the final result (completed), the JSON-RPC error (failed), the outstanding input requests.
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


def _task(value: Any, era: Era) -> Task:
    if not isinstance(value, Mapping):
        raise ResultTypeError("a task must be an object")
    task_id = value.get("taskId")
    status = value.get("status")
    if not isinstance(task_id, str) or not task_id:
        raise ResultTypeError("a task without a taskId")
    if status not in STATUSES:
        raise ResultTypeError(f"a task with an unknown status {str(status)[:40]!r}")
    message = value.get("statusMessage")
    interval = value.get("pollIntervalMs" if era is Era.MODERN else "pollInterval")
    poll = interval / 1000 if isinstance(interval, int | float) and not isinstance(interval, bool) and interval >= 0 \
        else None
    result, error, requests = value.get("result"), value.get("error"), value.get("inputRequests")
    if era is Era.MODERN:
        if status == "completed" and not isinstance(result, dict):
            raise ResultTypeError("a completed task without a result object")
        if status == "failed" and not isinstance(error, dict):
            raise ResultTypeError("a failed task without an error object")
        if status == "input_required" and not isinstance(requests, dict):
            raise ResultTypeError("an input_required task without inputRequests")
    return Task(
        task_id, str(status), message if isinstance(message, str) else None, poll,
        result if isinstance(result, dict) else None, error if isinstance(error, dict) else None,
        requests if isinstance(requests, dict) else None,
    )  # fmt: skip


def created(result: Mapping[str, Any], era: Era) -> Task | None:
    """The task a ``tools/call`` answer created, or None when it is an ordinary result.

    2025-11-25: a ``CreateTaskResult`` (``{task: {...}}``) answers a task-augmented call. 2026-07-28: a result
    with ``resultType: "task"`` is the task itself."""
    if era is Era.MODERN:
        if result.get("resultType") != "task":
            return None
        return _task(result, era)
    if "task" not in result or "content" in result:
        return None
    return _task(result.get("task"), era)


def observed(result: Mapping[str, Any], era: Era, task_id: str) -> Task:
    """A ``tasks/get`` answer, checked to be about ``task_id``."""
    task = _task(result, era)
    if task.task_id != task_id:
        raise ResultTypeError(f"tasks/get for {task_id[:64]!r} answered about another task")
    return task


def get_params(task_id: str) -> dict[str, Any]:
    return {"taskId": task_id}


def poll_delay(task: Task, *, default: float, floor: float, cap: float) -> float:
    """How long to wait before the next ``tasks/get``: the server's interval, kept within [floor, cap]."""
    wanted = task.poll_interval if task.poll_interval is not None else default
    return min(max(wanted, floor), cap)


def update_params(task: Task, answered: set[str]) -> dict[str, Any] | None:
    """The ``tasks/update`` for a 2026-07-28 ``input_required`` task: one answer per request key not answered
    yet (agentd.mcp.input_required.answer: declines and empty roots), or None when every key was answered.
    Raises :class:`ResultTypeError` when a request is one agentd cannot answer."""
    pending = {key: request for key, request in (task.input_requests or {}).items() if key not in answered}
    if not pending:
        return None
    return {"taskId": task.task_id, "inputResponses": {key: answer(request) for key, request in pending.items()}}


def cancel_params(task_id: str, era: Era | None, capabilities: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``tasks/cancel`` to send for an abandoned task, or None when the server cannot take one."""
    if era is Era.LEGACY and not legacy_can_cancel(capabilities):
        return None
    return {"taskId": task_id}


def modern_outcome(task: Task) -> dict[str, Any]:
    """A terminal 2026-07-28 task's result: the inline ``result``, or :class:`TaskFailed`."""
    if task.status == "completed":
        assert task.result is not None
        return task.result
    raise TaskFailed(task)


class TaskFailed(Exception):
    """A task ended ``failed`` or ``cancelled`` (2026-07-28: its inline JSON-RPC ``error``, if any)."""

    def __init__(self, task: Task) -> None:
        error = task.error or {}
        code = error.get("code")
        message = error.get("message")
        self.code = code if isinstance(code, int) and not isinstance(code, bool) else None
        self.detail = (message if isinstance(message, str) else None) or task.status_message or task.status
        super().__init__(f"the task {task.status}: {self.detail}")
        self.task = task
