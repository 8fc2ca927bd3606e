"""Waiting for a task-run tool call: polling, answering, fetching, and cancelling what is abandoned.

Why it exists: a ``tools/call`` a server runs as a task (agentd.mcp.tasks says which and how) is answered with
a handle, not the result. :class:`TaskWait` turns that handle into the tool's result, over the connection's
:class:`~agentd.client.exchange.Exchange`: ``tasks/get`` at the server's interval until the task is terminal
(2026-07-28: answering an ``input_required`` task with ``tasks/update`` where agentd can; 2025-11-25: handing
the wait to ``tasks/result``, on whose stream the server asks), then the result. It holds no child process and
no connection of its own: between polls it only sleeps, and a status notification the server pushes for the task
(``notifications/tasks`` on the modern listen stream, ``notifications/tasks/status`` on 2025-11-25) ends that
sleep early (agentd.client.subscriptions asks for them); polling stays the rule, a push only comes sooner.

Every wait is bounded by the caller's scope (the call timeout and the run's deadline: the connection wraps the
whole call in both); a poll the connection fails is tried again within them, as the task runs on at the
server. A wait that ends any other way than with the task's end (cancelled, timed out) sends
``tasks/cancel``, shielded and bounded by ``CLEANUP_GRACE``. Each status (and status message) the task reports
becomes one ``mcp.task`` event.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from agentd import defaults, telemetry
from agentd.client.exchange import CLEANUP_GRACE, Exchange, SessionGone
from agentd.client.subscriptions import Subscriptions
from agentd.errors import McpError, McpProtocolError, McpRpcError, McpTransportError
from agentd.mcp import jsonrpc, tasks
from agentd.mcp.client_session import ResultTypeError
from agentd.mcp.versions import Era
from agentd.telemetry.events import EventLog

#: Called once a task exists (its id), before the first poll: the durable wait journals it (agentd.run).
TaskStarted = Callable[[str], Awaitable[None]]


@attrs.define(eq=False)
class TaskWait:
    """One tool call's task, from its handle to its result."""

    exchange: Exchange
    log: EventLog
    server: str
    tool: str
    poll_default: float = defaults.TASK_POLL_DEFAULT
    poll_floor: float = defaults.TASK_POLL_MIN
    poll_cap: float = defaults.TASK_POLL_MAX
    _last: tuple[str, str | None] | None = None
    #: The task reached a terminal status (nothing left to cancel).
    _ended: bool = False
    _answered: set[str] = attrs.field(factory=set)
    #: The connection's subscriptions: asks for the task's status notifications and hears them (None: poll only).
    subscriptions: Subscriptions | None = None

    @property
    def era(self) -> Era:
        return self.exchange.session.era or Era.LEGACY

    async def run(self, task: tasks.Task, *, on_started: TaskStarted | None = None) -> dict[str, Any]:
        """The result of the call ``task`` stands for (a CallToolResult dict). Raises McpError when the task
        failed or the server broke the protocol; cancels the task on the server when abandoned (also when
        ``on_started``, told the task's id first, fails)."""
        telemetry.current_span().set_attribute("mcp.task.id", task.task_id)
        try:
            if on_started is not None:
                await on_started(task.task_id)
            return await self._wait(task)
        finally:
            if not self._ended:
                await self._cancel(task.task_id)

    async def resume(self, task_id: str) -> dict[str, Any]:
        """The result of a task an earlier process of the run started (its id journaled): polled at once; a
        task the server no longer knows fails the call (the tool is not called again)."""
        telemetry.current_span().set_attribute("mcp.task.id", task_id)
        try:
            task = await self._get(task_id)
        except trio.Cancelled:
            await self._cancel(task_id)
            raise
        except McpRpcError as exc:
            if exc.code != jsonrpc.INVALID_PARAMS:
                raise
            raise McpError(f"tools/call {self.tool}: the task {task_id!r} it started before agentd restarted is "
                           f"unknown to the server ({exc.rpc_message}); the tool was not called again",
                           server=self.server) from None
        return await self.run(task)

    async def _wait(self, task: tasks.Task) -> dict[str, Any]:
        self._note(task)
        if self.subscriptions is not None and not task.terminal:
            self.subscriptions.watch_task(task.task_id)
        try:
            while not task.terminal:
                if task.status == "input_required":
                    if self.era is Era.LEGACY:
                        break  # 2025-11-25: tasks/result carries the server's questions (answered by the session)
                    await self._update(task)
                await self._pause(task)
                task = await self._poll(task.task_id)
                self._note(task)
        finally:
            if self.subscriptions is not None:
                self.subscriptions.unwatch_task(task.task_id)
        if self.era is Era.MODERN:
            try:
                return tasks.modern_outcome(task)
            except tasks.TaskFailed as exc:
                raise self._failed(exc) from None
        if task.status == "cancelled":
            raise McpError(f"tools/call {self.tool}: the server cancelled the task {task.task_id!r}"
                           + (f" ({task.status_message})" if task.status_message else ""), server=self.server)
        return await self.exchange.request("tasks/result", tasks.get_params(task.task_id))

    async def _pause(self, task: tasks.Task) -> None:
        """The server's poll interval, or less: until a status notification for the task arrives."""
        delay = tasks.poll_delay(task, default=self.poll_default, floor=self.poll_floor, cap=self.poll_cap)
        nudge = self.subscriptions.task_nudge(task.task_id) if self.subscriptions is not None else None
        with trio.move_on_after(delay):
            if nudge is None:
                await trio.sleep_forever()
            await nudge.wait()

    async def _poll(self, task_id: str) -> tasks.Task:
        """``tasks/get`` during the wait. A poll the connection failed (the request's own retries spent: a reset,
        a reconnect under way) does not end the task, which runs on at the server: it is logged and tried again
        after a growing pause (at most the interval cap), for as long as the caller's bounds allow."""
        failures = 0
        while True:
            try:
                return await self._get(task_id)
            except McpTransportError as exc:
                failures += 1
                self.log.warn("mcp.task_poll_failed", server=self.server, tool=self.tool, task_id=task_id,
                              attempt=failures, error=str(exc))  # fmt: skip
                await trio.sleep(min(self.poll_cap, self.poll_default * 2 ** min(failures - 1, 5)))

    async def _get(self, task_id: str) -> tasks.Task:
        result = await self.exchange.request("tasks/get", tasks.get_params(task_id))
        try:
            return tasks.observed(result, self.era, task_id)
        except ResultTypeError as exc:
            raise McpProtocolError(f"tasks/get: {exc}", server=self.server) from None

    async def _update(self, task: tasks.Task) -> None:
        try:
            params = tasks.update_params(task, self._answered)
        except ResultTypeError as exc:
            raise McpProtocolError(f"tools/call {self.tool}: task {task.task_id!r}: {exc}", server=self.server) \
                from None
        if params is None:
            return
        self._answered.update(params["inputResponses"])
        await self.exchange.request("tasks/update", params)
        self.log.info("mcp.task_input", server=self.server, tool=self.tool, task_id=task.task_id,
                      keys=sorted(params["inputResponses"]))  # fmt: skip

    def _note(self, task: tasks.Task) -> None:
        self._ended = task.terminal
        seen = (task.status, task.status_message)
        if seen == self._last:
            return
        self._last = seen
        self.log.info("mcp.task", server=self.server, tool=self.tool, task_id=task.task_id, status=task.status,
                      message=task.status_message)  # fmt: skip
        telemetry.current_span().set_attribute("mcp.task.status", task.status)

    def _failed(self, exc: tasks.TaskFailed) -> McpError:
        what = f"tools/call {self.tool}: the task {exc.task.task_id!r} {exc.task.status}: {exc.detail}"
        if exc.code is not None:
            return McpRpcError(exc.code, what, None, server=self.server, method="tools/call")
        return McpError(what, server=self.server)

    async def _cancel(self, task_id: str) -> None:
        """Tell the server agentd stopped waiting (shielded, bounded); a failure to is only logged."""
        session = self.exchange.session
        params = tasks.cancel_params(task_id, session.era, session.capabilities)
        if params is None or not self.exchange.liveness.connected:
            return
        error = "no answer in time"
        with trio.move_on_after(CLEANUP_GRACE, shield=True):
            try:
                await self.exchange.request_once("tasks/cancel", params)
                self.log.info("mcp.task_cancelled", server=self.server, tool=self.tool, task_id=task_id)
                return
            except (McpError, SessionGone) as exc:
                error = str(exc) or type(exc).__name__
        self.log.warn("mcp.task_cancel_failed", server=self.server, tool=self.tool, task_id=task_id, error=error)
