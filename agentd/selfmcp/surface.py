"""The served self-MCP surface: five tools, ``agent://`` resources, and ``updated`` on terminal status
(and on a warm session's turn end).

:class:`SelfMcpSurface` answers every request the protocol core hands over (``tools/*``,
``resources/*``), backed by a :class:`~agentd.selfmcp.backend.SelfMcpBackend`. It owns one nursery
(``await nursery.start(surface.run)``) in which one watcher per served run waits for the terminal
status, fires the subscriptions, and evicts the handle after ``retention`` seconds; for a warm session
the watcher also notifies (without consuming) the subscribers each time a turn answers, the closest
analogue of a terminal status for a session that stays open. Each end is also a served event
(``subagent.finished``, agentd.selfmcp.served_events) that a 2026-07-28 client polls with ``events/poll`` or
follows with ``events/stream``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import attrs
import trio

from agentd import defaults
from agentd._version import __version__
from agentd.formats import jsontext as json_text
from agentd.mcp import jsonrpc, meta, served_events
from agentd.mcp.jsonrpc import ErrorResponse, Request, Response
from agentd.mcp.server_session import ServerIdentity
from agentd.mcp.versions import Era
from agentd.selfmcp import tasks
from agentd.selfmcp.backend import Refusal, RunView, SelfMcpBackend, ServedSpawn
from agentd.selfmcp.served_events import EventStream, ServedEvents
from agentd.selfmcp.subscriptions import Sink, SubscriptionLimit, Subscriptions
from agentd.selfmcp.tools import TOOL_NAMES, TOOLS, schema_errors
from agentd.telemetry.events import EventLog, null_log
from agentd.transport.asgi_server import CallContext, ListenTicket
from agentd.transport.tenancy import LOCAL, LOCAL_KEY, Owners, Principal

STATUS_URI: Final = "agent://status"
SUBAGENT_PREFIX: Final = "agent://subagent/"
CAPABILITIES: Final = {"tools": {}, "resources": {"subscribe": True}}
_HANDLE_RE: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


#: One served tool: ``(arguments, ctx) -> tools/call result``.
ToolHandler = Callable[[Mapping[str, Any], CallContext], Awaitable[dict[str, Any]]]
#: The daemon mode's read-only snapshot for ``agent://status`` (None outside daemon modes).
DaemonStatus = Callable[[], Mapping[str, Any] | None]


def _no_daemon_status() -> Mapping[str, Any] | None:
    return None


@attrs.frozen
class AgentInfo:
    run_id: str
    mode: str
    version: str = __version__
    pid: int = attrs.field(factory=os.getpid)
    #: The daemon mode's read-only snapshot (subscriptions, wakes, budget) for ``agent://status``, or None
    #: outside daemon modes; handed in by the daemon, which owns both the mode and the served surface.
    daemon_status: DaemonStatus = _no_daemon_status


@attrs.frozen
class SelfMcpLimits:
    """What the served surface allows; build it from the Config (agentd.selfmcp.serving.build_app)."""

    max_concurrent_spawns: int = defaults.SERVE_MAX_SPAWNS
    max_warm: int = defaults.SERVE_MAX_WARM
    #: ``--cluster``: async spawns queued as cluster rows (a backend whose ``queues(spawn)`` says so) and not
    #: ended yet; they are not runs of this member, so ``max_concurrent_spawns`` does not count them.
    max_queued: int = defaults.SERVE_MAX_QUEUED
    max_subscriptions: int = 64
    retention: float = defaults.SERVE_RETENTION
    #: How long a cancelled request waits for its run's cancel (``--cancel-grace``).
    cancel_grace: float = defaults.CANCEL_GRACE


@attrs.define(eq=False)
class ServedRun:
    handle: str
    warm: bool
    started: float
    #: A cluster row this surface queued (``--serve-max-queued``), or a handle it only watches for a peer
    #: (another member spawned it): neither is a run of this member's supervisor.
    queued: bool = False
    watched: bool = False
    #: The principal that spawned it (agentd.transport.tenancy); only it (and an operator) sees the handle.
    owner: str = LOCAL_KEY
    #: Spawned as a 2025-11-25 task (``--serve-tasks``): listed by ``tasks/list``.
    task: bool = False
    #: Wall clock: when this process started tracking it, and when it ended (a task's timestamps).
    created_at: float = attrs.field(factory=time.time)
    ended_at: float | None = None
    #: ``--serve-accept-cancel``: the legacy (session, request id) whose ``notifications/cancelled`` ends it.
    cancel_key: tuple[str, str] | None = None
    final: RunView | None = None
    finished: trio.Event = attrs.field(factory=trio.Event)


def _text_result(structured: Mapping[str, Any], *, is_error: bool = False) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": json_text.compact(structured)}],
        "structuredContent": dict(structured),
        "isError": is_error,
    }


#: The retry hint for a retryable refusal with no known wait (a live-count cap frees when a run ends).
RETRY_POLL_S: Final = 1.0


def _shown(text: str, limit: int = 200) -> str:
    """A caller's string as echoed back in an error: cut to ``limit`` characters (a peer's megabyte of handle is
    not sent back to it)."""
    return text if len(text) <= limit else text[:limit] + "…"


def _refused(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}


def _spawn_refused(refusal: Refusal) -> dict[str, Any]:
    """A refused spawn: the text for a model, ``structuredContent`` for a program deciding to retry."""
    retry: float | None = None
    if refusal.retryable:
        retry = round(refusal.retry_after, 3) if refusal.retry_after > 0 else RETRY_POLL_S
    # Shaped like every spawn answer (the tool's outputSchema: SDK clients validate it even on isError).
    structured = {"handle": "", "status": "refused", "done": True, "refused": refusal.cap,
                  "retryable": refusal.retryable, "retry_after_s": retry}
    return {**_refused(refusal.reason), "structuredContent": structured}


class SelfMcpSurface:
    """Implements :class:`agentd.transport.asgi_server.McpHandler` for agentd's own surface."""

    def __init__(
        self,
        backend: SelfMcpBackend,
        info: AgentInfo,
        *,
        limits: SelfMcpLimits | None = None,
        log: EventLog | None = None,
        owners: Owners | None = None,
        serve_tasks: bool = False,
        events: ServedEvents | None = None,
    ) -> None:
        self.backend = backend
        #: Who owns each tracked handle: shared with the A2A endpoint and ``/events`` (one ownership rule), and
        #: with a backend that keeps one (a journaled session re-opened under a new child's handle).
        shared = getattr(backend, "owners", None)
        self.owners: Owners = owners if owners is not None else shared if isinstance(shared, Owners) else Owners()
        self.info = info
        self.limits = limits or SelfMcpLimits()
        self.log = log or null_log()
        self._debug = self.log.enabled("debug")
        #: ``--serve-tasks``: the 2025-11-25 wire runs ``subagent.spawn`` as a task when asked (agentd.selfmcp.tasks).
        self.serve_tasks = serve_tasks
        #: The served Events extension's log (2026-07-28 wire): journaled when the daemon has a journal.
        self.events = events if events is not None else ServedEvents(log=self.log)
        # server/discover (2026-07-28) declares the tasks and events extensions; initialize (2025-11-25) declares
        # tasks only with --serve-tasks, and is otherwise exactly CAPABILITIES.
        self.identity = ServerIdentity(
            "agentd", info.version,
            {**CAPABILITIES, "extensions": {**tasks.MODERN_CAPABILITY, served_events.EXTENSION: {}}},
            legacy_capabilities={**CAPABILITIES, "tasks": tasks.CAPABILITY} if serve_tasks else CAPABILITIES)
        self.subscriptions = Subscriptions(max_per_peer=self.limits.max_subscriptions)
        self.runs: dict[str, ServedRun] = {}
        self._reserved = 0
        self._reserved_warm = 0
        self._reserved_queued = 0
        self._nursery: trio.Nursery | None = None
        self._started = 0.0
        self._refused_by: dict[str, int] = {}
        #: ``--serve-accept-cancel``: the sync spawns' runs by the legacy request that started them (live runs only).
        self._by_request: dict[tuple[str, str], str] = {}
        self._waiting = 0  # sync spawn calls waiting for their run's end
        self._none_waiting = trio.Event()
        self._none_waiting.set()
        #: The dispatch table: every served tool by name, and nothing else is callable.
        self._tools: dict[str, ToolHandler] = {
            "status": self._tool_status,
            "subagent.spawn": self._tool_spawn,
            "subagent.send": self._tool_send,
            "subagent.status": self._tool_subagent_status,
            "subagent.cancel": self._tool_cancel,
        }
        assert set(self._tools) == set(TOOL_NAMES), "every listed tool has a handler, and only those"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the run watchers; cancelled with the daemon nursery."""
        self._started = trio.current_time()
        from agentd.oversight.approvals import current_approvals

        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._catch_up()
            queue = current_approvals()
            if queue is not None:  # what waits for a person: approval.pending / approval.decided events
                nursery.start_soon(self.events.approvals, queue, self.owners.owner_of_path)
            task_status.started()
            await trio.sleep_forever()

    async def _catch_up(self) -> None:
        """At start-up, every handle an earlier process journaled is tracked, so the end of one still running
        becomes an event; one that ended gets its ``subagent.finished`` if that process did not write it."""
        handles = getattr(self.backend, "handles", None)
        spawned_at = getattr(self.backend, "spawned_at", None)
        for handle in handles() if handles is not None else ():
            await self._look_up(handle)
            run = self.runs.get(handle)
            if run is not None and run.final is not None:  # ended before this process: its watcher never ran
                since = spawned_at(handle) if spawned_at is not None else None
                await self.events.ensure_finished(handle, run.owner, self._terminal(run.final), since)

    # -- dispatch --------------------------------------------------------------------------------------

    async def handle(self, request: Request, ctx: CallContext) -> Response | ErrorResponse:
        params = request.params or {}
        method = request.method
        legacy_tasks = self.serve_tasks and ctx.era is Era.LEGACY
        if method == "tools/list":
            return Response(request.id, {"tools": tasks.tools_with_support(TOOLS) if legacy_tasks else TOOLS})
        if method == "tools/call":
            if legacy_tasks and tasks.requested(params):
                return await self._call_as_task(request, params, ctx)
            if ctx.era is Era.MODERN and tasks.modern_wanted(params):
                return await self._call_as_task(request, params, ctx)
            return await self._call_tool(request, params, ctx)
        if legacy_tasks and method.startswith("tasks/"):
            return await self._task_request(request, params, ctx)
        if ctx.era is Era.MODERN and method in served_events.METHODS:
            return self._events_request(request, params, ctx)
        if ctx.era is Era.MODERN and method in tasks.MODERN_METHODS:
            if not tasks.declares_extension(params):
                return ErrorResponse(request.id, jsonrpc.MISSING_CLIENT_CAPABILITY, "Missing required client capability",
                                     {"requiredCapabilities": {"extensions": tasks.MODERN_CAPABILITY}})
            return await self._task_request(request, params, ctx)
        if method == "resources/list":
            return Response(request.id, {"resources": [{
                "uri": STATUS_URI, "name": "status", "mimeType": "application/json",
                "description": "this agent's run id, mode, version, pid, uptime and spawn counts"}]})
        if method == "resources/templates/list":
            return Response(request.id, {"resourceTemplates": []})
        if method == "resources/read":
            uri = params.get("uri")
            if isinstance(uri, str) and uri.startswith(SUBAGENT_PREFIX):
                await self._look_up(uri[len(SUBAGENT_PREFIX):])
            return self._read(request, params, ctx.principal)
        if method == "resources/subscribe" and ctx.session_id is not None:
            uri = params.get("uri")
            if isinstance(uri, str) and uri.startswith(SUBAGENT_PREFIX):
                await self._look_up(uri[len(SUBAGENT_PREFIX):])
            return self._subscribe(request, params, ctx)
        if method == "resources/unsubscribe" and ctx.session_id is not None:
            uri = params.get("uri")
            if not isinstance(uri, str):
                return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS, "uri must be a string")
            self.subscriptions.remove(ctx.session_id, uri)
            return Response(request.id, {})
        return ErrorResponse(request.id, jsonrpc.METHOD_NOT_FOUND, f"Method not found: {_shown(method)}")

    def _events_request(self, request: Request, params: Mapping[str, Any], ctx: CallContext,
                        ) -> Response | ErrorResponse:
        """``events/list`` and ``events/poll`` (agentd.selfmcp.served_events): a principal polls its own events."""
        if not served_events.declares_extension(params):
            return ErrorResponse(request.id, jsonrpc.MISSING_CLIENT_CAPABILITY, "Missing required client capability",
                                 {"requiredCapabilities": {"extensions": {served_events.EXTENSION: {}}}})
        if request.method == "events/list":
            return Response(request.id, served_events.catalogue())
        if request.method == served_events.STREAM:  # reached only when the client does not accept SSE
            return ErrorResponse(request.id, jsonrpc.INVALID_REQUEST, "events/stream answers as text/event-stream")
        try:
            return Response(request.id, self.events.poll(params, ctx.principal.owns))
        except served_events.PollError as exc:
            return ErrorResponse(request.id, exc.code, str(exc), exc.data)

    def open_stream(self, request: Request, ctx: CallContext) -> EventStream | ErrorResponse | None:
        """``events/stream`` (2026-07-28 wire): push delivery of the principal's own events, or the error that
        refuses it before any stream opens; None for every other request."""
        if ctx.era is not Era.MODERN or request.method != served_events.STREAM:
            return None
        params = request.params or {}
        if not served_events.declares_extension(params):
            return ErrorResponse(request.id, jsonrpc.MISSING_CLIENT_CAPABILITY, "Missing required client capability",
                                 {"requiredCapabilities": {"extensions": {served_events.EXTENSION: {}}}})
        try:
            return self.events.open_stream(params, ctx.principal.key, ctx.principal.owns, request.id)
        except served_events.PollError as exc:
            return ErrorResponse(request.id, exc.code, str(exc), exc.data)

    def streams(self, request: Request) -> bool:
        """A synchronous ``subagent.spawn`` may run for minutes: answer it as SSE so keepalives flow."""
        params = request.params
        if request.method == "tasks/result":
            return self.serve_tasks  # waits for the run's end, as a sync spawn does
        if request.method != "tools/call" or not params or params.get("name") != "subagent.spawn":
            return False
        if meta.envelope_version(params) is None:
            if self.serve_tasks and tasks.requested(params):
                return False  # a 2025-11-25 task: answered at once
        elif tasks.modern_wanted(params):
            return False  # a 2026-07-28 task: answered at once
        arguments = params.get("arguments") or {}
        return isinstance(arguments, dict) and not arguments.get("async") and not arguments.get("warm")

    # -- tools ---------------------------------------------------------------------------------------------

    async def _call_tool(self, request: Request, params: Mapping[str, Any], ctx: CallContext) -> Response | ErrorResponse:
        name = params.get("name")
        if not isinstance(name, str) or name not in self._tools:
            return ErrorResponse(request.id, jsonrpc.METHOD_NOT_FOUND, f"Unknown tool: {name!r}"[:200])
        tool = self._tools[name]
        arguments = params.get("arguments", {})
        if arguments is None:
            arguments = {}
        problems = [] if (name == "status" and arguments == {}) else schema_errors(name, arguments)
        if problems:
            return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS, f"Invalid arguments for {name}: {problems[0]}",
                                 {"errors": problems[:8]})
        if self._debug:
            self.log.debug("serve.request", method="tools/call", tool=name)
        return Response(request.id, await tool(arguments, ctx))

    # -- tasks (``--serve-tasks``, the 2025-11-25 wire): a task is a served handle (agentd.selfmcp.tasks) ---

    def _task_body(self, run: ServedRun, era: Era, ended: RunView | None = None) -> dict[str, Any]:
        final = run.final or ended
        status, done = (final.status, True) if final is not None else ("running", False)
        timing = {"created": run.created_at, "updated": run.ended_at or run.created_at,
                  "ttl_s": self.limits.retention, "poll_s": defaults.SERVE_TASK_POLL_INTERVAL}
        if era is Era.MODERN:
            result = _text_result(self._terminal(final)) if final is not None else None
            return tasks.modern_task(run.handle, status, done, result, **timing)
        return tasks.task(run.handle, status, done, **timing)

    async def _call_as_task(self, request: Request, params: Mapping[str, Any], ctx: CallContext,
                            ) -> Response | ErrorResponse:
        """A task-augmented ``tools/call``: an async spawn whose handle is the task, answered at once."""
        name = params.get("name")
        if name != tasks.TASK_TOOL:  # every other tool's taskSupport is forbidden
            return ErrorResponse(request.id, jsonrpc.METHOD_NOT_FOUND,
                                 f"{name!r} cannot run as a task (only {tasks.TASK_TOOL} can)"[:200])
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        problems = schema_errors(name, arguments)
        if problems:
            return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS, f"Invalid arguments for {name}: {problems[0]}",
                                 {"errors": problems[:8]})
        if arguments.get("warm"):
            return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS,
                                 "a warm session cannot run as a task: drop warm or params.task")
        result = await self._spawn({**arguments, "async": True}, ctx, task=True)
        structured = result.get("structuredContent") or {}
        run = self.runs.get(structured.get("handle") or "")
        if run is None:  # refused (a cap): the refusal is the answer, as without a task
            return Response(request.id, result)
        run.task = True
        task_of = getattr(self.backend, "task_of", None)  # a journaled task's createdAt is the journal's
        created = task_of(run.handle) if task_of is not None else None
        run.created_at = created or run.created_at
        if ctx.era is Era.MODERN:
            # The server decides per request (SEP-2663): a run that ends within the wait is answered inline,
            # exactly as a sync spawn, with no poll round; a longer one becomes a task.
            with trio.move_on_after(defaults.SERVE_TASK_INLINE_WAIT):
                await run.finished.wait()
            if run.final is not None:
                return Response(request.id, _text_result(self._terminal(run.final)))
            return Response(request.id, {"resultType": "task", **self._task_body(run, ctx.era)})
        self._push_status(run, ctx)
        return Response(request.id, {"task": self._task_body(run, ctx.era)})

    def _push_status(self, run: ServedRun, ctx: CallContext) -> None:
        """2025-11-25 (``--serve-tasks``): the task's end is ``notifications/tasks/status`` (its ``tasks/get``
        body) on the creating session's GET stream, which the experimental tasks allow a receiver to send; a
        session past its subscription limit is left to polling."""
        push, session = ctx.push, ctx.session_id
        if push is None or session is None:
            return
        if run.final is not None:  # already ended: no watcher will fire
            push("notifications/tasks/status", self._task_body(run, Era.LEGACY))
            return

        def pushed(uri: str) -> None:
            push("notifications/tasks/status", self._task_body(run, Era.LEGACY))

        try:
            self.subscriptions.add((session, "tasks"), SUBAGENT_PREFIX + run.handle, pushed)
        except SubscriptionLimit:
            pass

    async def _task_request(self, request: Request, params: Mapping[str, Any], ctx: CallContext,
                            ) -> Response | ErrorResponse:
        method = request.method
        if method == "tasks/list":  # the caller's tasks (an ended one for --serve-retention), journaled ones too
            kept = getattr(self.backend, "tasks", None)  # journaled ones (--state-dir), other members' (--cluster)
            since = time.time() - self.limits.retention
            for handle in await kept(None if ctx.principal.operator else ctx.principal.key, since) if kept else ():
                await self._look_up(handle)
            mine = sorted((r for r in self.runs.values() if r.task and ctx.principal.owns(r.owner)),
                          key=lambda r: r.created_at)
            return Response(request.id, {"tasks": [self._task_body(r, ctx.era) for r in mine]})
        served = tasks.MODERN_METHODS if ctx.era is Era.MODERN else {"tasks/get", "tasks/result", "tasks/cancel"}
        if method not in served:
            return ErrorResponse(request.id, jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}"[:200])
        handle = tasks.task_id(params)
        if handle is None:
            return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS, "taskId must be a non-empty string")
        if _HANDLE_RE.match(handle):
            await self._look_up(handle)  # journaled by an earlier process, or another member's
        run = self._mine(handle, ctx.principal)
        if run is None or run.warm:  # another principal's task is as unknown as one never created
            return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS, "Failed to retrieve task: Task not found",
                                 {"taskId": handle[:64]})
        if method == "tasks/get":
            return Response(request.id, self._task_body(run, ctx.era))
        if method == "tasks/update":  # a served spawn never asks its requestor for input
            return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS, "the task is not awaiting input",
                                 {"taskId": handle})
        if method == "tasks/result":  # the run's end, exactly as a sync spawn answers it (and drained like one)
            self._waiting += 1
            self._none_waiting = trio.Event()
            try:
                await run.finished.wait()
            finally:
                self._waiting -= 1
                if not self._waiting:
                    self._none_waiting.set()
            assert run.final is not None
            return Response(request.id, tasks.with_related(_text_result(self._terminal(run.final)), handle))
        if run.final is not None:
            state = tasks.task_status(run.final.status, True)
            return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS,
                                 f"Cannot cancel task: already in terminal status {state!r}", {"taskId": handle})
        self.log.info("serve.request", method="tasks/cancel", handle=handle)
        after = await self.backend.cancel(handle)  # the kill ladder
        with trio.move_on_after(self.limits.cancel_grace):
            await run.finished.wait()
        return Response(request.id, self._task_body(run, ctx.era, after if after is not None and after.done else None))

    # -- the five tools: ``_tools`` maps each served name to one of these -----------------------------------

    async def _tool_status(self, arguments: Mapping[str, Any], ctx: CallContext) -> dict[str, Any]:
        return _text_result(self.status())

    async def _tool_spawn(self, arguments: Mapping[str, Any], ctx: CallContext) -> dict[str, Any]:
        return await self._spawn(arguments, ctx)

    async def _tool_send(self, arguments: Mapping[str, Any], ctx: CallContext) -> dict[str, Any]:
        await self._look_up(arguments["handle"])
        return await self._send(arguments["handle"], arguments["message"], ctx.principal)

    async def _look_up(self, handle: str) -> None:
        """A handle this surface did not spawn may be known to a shared backend (``--cluster``) or journaled
        by an earlier process (``--state-dir``, agentd.selfmcp.journaled): track it."""
        lookup = getattr(self.backend, "lookup", None)
        if handle in self.runs or lookup is None:
            return
        found = await lookup(handle)
        if found is not None and handle not in self.runs:
            owner_of = getattr(self.backend, "owner_of", None)  # journaled with the handle; else the operator's
            owner = owner_of(handle) if owner_of is not None else LOCAL_KEY
            task_of = getattr(self.backend, "task_of", None)  # spawned as an MCP task, and when
            created = task_of(handle) if task_of is not None else None
            run = ServedRun(handle, False, trio.current_time(), owner=owner, final=found if found.done else None)
            if created is not None:
                run.task, run.created_at = True, created or run.created_at
            if found.done:
                run.ended_at = time.time()
                run.finished.set()
                self.runs[handle] = run
                self.owners.claim(handle, owner)
                assert self._nursery is not None
                self._nursery.start_soon(self._forget_later, run)
            else:
                warm = found.turns is not None  # a warm session's view counts its turns
                # watched: another member's (or an earlier process's)
                tracked = self._track(handle, warm, watched=not warm, owner=owner)
                tracked.task, tracked.created_at = run.task, run.created_at

    async def _forget_later(self, run: ServedRun) -> None:
        await trio.sleep(self.limits.retention)
        if self.runs.get(run.handle) is run:
            self._drop(run)

    def _drop(self, run: ServedRun) -> None:
        self.runs.pop(run.handle, None)
        self.owners.forget(run.handle)
        self.backend.forget(run.handle)

    def _mine(self, handle: str, principal: Principal) -> ServedRun | None:
        """The tracked run behind ``handle`` if ``principal`` may see it; another principal's run is None,
        exactly as a handle never issued."""
        run = self.runs.get(handle)
        return run if run is not None and principal.owns(run.owner) else None

    async def _tool_subagent_status(self, arguments: Mapping[str, Any], ctx: CallContext) -> dict[str, Any]:
        await self._look_up(arguments["handle"])
        view = self.view(arguments["handle"]) if self._mine(arguments["handle"], ctx.principal) else None
        return _text_result(view) if view is not None else _refused(f"unknown handle {_shown(arguments['handle'])!r}")

    async def _tool_cancel(self, arguments: Mapping[str, Any], ctx: CallContext) -> dict[str, Any]:
        await self._look_up(arguments["handle"])
        return await self._cancel(arguments["handle"], ctx.principal)

    def status(self) -> dict[str, Any]:
        counts = dict(self.backend.counts())
        counts.setdefault("served_running", sum(1 for r in self.runs.values() if r.final is None))
        counts["refused"] = sum(self._refused_by.values())  # the surface's own caps and the chokepoint's
        body = {
            "run_id": self.info.run_id,
            "mode": self.info.mode,
            "version": self.info.version,
            "pid": self.info.pid,
            "uptime_ms": int((trio.current_time() - self._started) * 1000),
            "spawns": counts,
            "refusals": dict(sorted(self._refused_by.items())),  # refused spawns by cap
        }
        daemon = self.info.daemon_status()
        if daemon is not None:  # daemon modes: subscriptions (incl. the agent's own), wakes, budget
            body["reactive"] = dict(daemon)
        return body

    def _running(self, warm: bool) -> int:
        return sum(1 for r in self.runs.values()
                   if r.final is None and r.warm == warm and not r.queued and not r.watched)

    def _queued(self) -> int:
        return sum(1 for r in self.runs.values() if r.final is None and r.queued)

    def _over_limit(self, spawn: ServedSpawn, queued: bool) -> Refusal | None:
        """The served limit this spawn would pass, as a refusal naming its flag (None: admitted)."""
        if queued:
            if self._queued() + self._reserved_queued >= self.limits.max_queued:
                return Refusal(f"spawn refused: {self.limits.max_queued} cluster spawns queued here have not "
                               f"ended yet (--serve-max-queued)", cap="serve_max_queued", retryable=True)
        elif spawn.warm:
            if self._running(True) + self._reserved_warm >= self.limits.max_warm:
                return Refusal(f"spawn refused: {self.limits.max_warm} warm sessions already open "
                               f"(--serve-max-warm)", cap="serve_max_warm", retryable=True)
        elif self._running(False) + self._reserved >= self.limits.max_concurrent_spawns:
            return Refusal(f"spawn refused: {self.limits.max_concurrent_spawns} served spawns already running "
                           f"(--serve-max-spawns)", cap="serve_max_spawns", retryable=True)
        return None

    def _reserve(self, spawn: ServedSpawn, queued: bool, delta: int) -> None:
        if queued:
            self._reserved_queued += delta
        elif spawn.warm:
            self._reserved_warm += delta
        else:
            self._reserved += delta

    async def _spawn(self, arguments: Mapping[str, Any], ctx: CallContext, *, task: bool = False) -> dict[str, Any]:
        warm = bool(arguments.get("warm", False))
        detached = bool(arguments.get("async", False))
        owner = ctx.principal.key
        admitted = self.owners.claims(owner)  # owned from its admission on: its first lines are its owner's
        scope = arguments.get("tool_scope")
        spawn = ServedSpawn(
            instruction=arguments["instruction"],
            output_contract=arguments.get("output_contract"),
            tool_scope=tuple(scope) if scope is not None else None,
            warm=warm,
            detached=detached,
            owner=ctx.principal.key,
            on_admitted=admitted,
            task=task,
            model=str(arguments["model"]) if arguments.get("model") is not None else None,
        )
        queues = getattr(self.backend, "queues", None)  # --cluster: an async spawn is a queued row
        queued = bool(queues(spawn)) if queues is not None else False
        refusal = self._over_limit(spawn, queued)
        if refusal is not None:
            return self._refuse(refusal)
        self._reserve(spawn, queued, 1)
        try:
            answer = await self.backend.spawn(spawn)
        finally:
            self._reserve(spawn, queued, -1)
        if isinstance(answer, Refusal):
            admitted.release()  # admitted, then refused (no process): nothing of it is served
            self._count_refusal(answer)  # the supervisor logged its own refusal
            return _spawn_refused(answer)
        run = self._track(answer, warm, queued=queued, owner=owner)
        self.log.info("serve.request", tool="subagent.spawn", handle=answer, warm=warm, detached=detached)
        if warm:
            # The backend answers a warm spawn once the first turn (the instruction) has answered or the
            # session is past it: the ack is the handle's current state, that turn's result included.
            return _text_result(self.view(answer) or {"handle": answer, "status": "running", "done": False})
        if detached:
            return _text_result({"handle": answer, "status": "running", "done": False})
        if ctx.request_id is not None and ctx.session_id is not None:  # --serve-accept-cancel (legacy wire)
            run.cancel_key = (ctx.session_id, repr(ctx.request_id))
            self._by_request[run.cancel_key] = answer
        self._waiting += 1
        self._none_waiting = trio.Event()
        try:
            await run.finished.wait()
        except trio.Cancelled:
            if ctx.cancel_on_disconnect:
                # Modern wire: the peer closed the response stream, which cancels this request and its run.
                with trio.CancelScope(shield=True), trio.move_on_after(self.limits.cancel_grace):
                    await self.backend.cancel(answer)
            raise
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._none_waiting.set()
        assert run.final is not None
        return _text_result(self._terminal(run.final))

    async def answered(self, timeout: float) -> None:
        """Wait (at most ``timeout``) until no sync spawn call is still waiting for its run: at drain, once
        the runs ended, their callers get the final answers before the listener stops."""
        with trio.move_on_after(timeout):
            await self._none_waiting.wait()

    def _refuse(self, refusal: Refusal) -> dict[str, Any]:
        self.log.info("serve.refused", reason="spawn_limit", message=refusal.reason, cap=refusal.cap)
        self._count_refusal(refusal)
        return _spawn_refused(refusal)

    def _count_refusal(self, refusal: Refusal) -> None:
        if refusal.cap in self._refused_by or len(self._refused_by) < 64:  # cap names are a small fixed set
            self._refused_by[refusal.cap] = self._refused_by.get(refusal.cap, 0) + 1

    def _track(self, handle: str, warm: bool, *, queued: bool = False, watched: bool = False,
               owner: str = LOCAL_KEY) -> ServedRun:
        run = ServedRun(handle, warm, trio.current_time(), queued=queued, watched=watched, owner=owner)
        self.runs[handle] = run
        self.owners.claim(handle, owner)
        assert self._nursery is not None, "SelfMcpSurface.run must be started first"
        self._nursery.start_soon(self._watch, run)
        return run

    async def _watch(self, run: ServedRun) -> None:
        async with trio.open_nursery() as turns:
            if run.warm:
                turns.start_soon(self._watch_turns, run)
            run.final = await self.backend.wait(run.handle)
            turns.cancel_scope.cancel()
        run.ended_at = time.time()
        if run.cancel_key is not None and self._by_request.get(run.cancel_key) == run.handle:
            del self._by_request[run.cancel_key]
        await self.events.finished(run.handle, run.owner, self._terminal(run.final))  # before anyone is answered
        run.finished.set()
        fired = self.subscriptions.fire(SUBAGENT_PREFIX + run.handle)
        if fired:
            self.log.info("serve.updated", uri=SUBAGENT_PREFIX + run.handle, peers=fired)
        await trio.sleep(self.limits.retention)
        self._drop(run)  # the supervisor keeps the ended node's view until told

    async def _watch_turns(self, run: ServedRun) -> None:
        """A warm session: each turn that answers notifies the handle's subscribers (kept, not consumed)."""
        live = self.backend.view(run.handle)
        seen = live.turns if live is not None and live.turns is not None else 0
        uri = SUBAGENT_PREFIX + run.handle
        while True:
            view = await self.backend.wait_turns(run.handle, seen)
            if view.done or view.turns is None or view.turns <= seen:
                return  # the end is the terminal watcher's to announce
            seen = view.turns
            fired = self.subscriptions.notify(uri)
            if fired:
                self.log.info("serve.updated", uri=uri, peers=fired, turn=seen)

    async def _send(self, handle: str, message: str, principal: Principal = LOCAL) -> dict[str, Any]:
        run = self._mine(handle, principal)
        if run is None:
            return _refused(f"unknown handle {_shown(handle)!r}")
        if not run.warm or run.final is not None:
            return _refused(f"{handle} is not an open warm session")
        answer = await self.backend.send(handle, message)
        if isinstance(answer, Refusal):
            return _refused(answer.reason)
        return _text_result({"handle": handle, "accepted": True})

    async def _cancel(self, handle: str, principal: Principal = LOCAL) -> dict[str, Any]:
        run = self._mine(handle, principal)
        if run is None:
            return _refused(f"unknown handle {_shown(handle)!r}")
        if run.final is None:
            self.log.info("serve.request", tool="subagent.cancel", handle=handle)
            after = await self.backend.cancel(handle)
            if after is not None and after.done:
                return _text_result(self._terminal(after))
        view = self.view(handle)
        assert view is not None
        return _text_result(view)

    # -- resources -----------------------------------------------------------------------------------------

    @staticmethod
    def _terminal(view: RunView) -> dict[str, Any]:
        body = {"handle": view.handle, "status": view.status, "done": True, "partial": view.partial,
                "result": view.result}
        if view.turns is not None:
            body["turns"] = view.turns
        return body

    def view(self, handle: str) -> dict[str, Any] | None:
        run = self.runs.get(handle)
        if run is None:
            return None
        if run.final is not None:
            return self._terminal(run.final)
        live = self.backend.view(handle)
        status = live.status if live is not None and not live.done else "running"
        body: dict[str, Any] = {"handle": handle, "status": status, "done": False,
                                "age_ms": int((trio.current_time() - run.started) * 1000)}
        if live is not None and not live.done and live.turns is not None:
            # A warm session: which turn answered last, and (while it waits for the next) that answer.
            body["turns"] = live.turns
            if status == "awaiting_turn":
                body["partial"] = live.partial
                body["result"] = live.result
        return body

    def _read(self, request: Request, params: Mapping[str, Any], principal: Principal = LOCAL,
              ) -> Response | ErrorResponse:
        uri = params.get("uri")
        if not isinstance(uri, str):
            return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS, "uri must be a string")
        if uri == STATUS_URI:
            body: dict[str, Any] | None = self.status()
        elif uri.startswith(SUBAGENT_PREFIX) and self._mine(uri[len(SUBAGENT_PREFIX):], principal) is not None:
            body = self.view(uri[len(SUBAGENT_PREFIX):])
        else:
            body = None
        if body is None:
            return ErrorResponse(request.id, jsonrpc.RESOURCE_NOT_FOUND, "Resource not found", {"uri": _shown(uri, 1024)})
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        return Response(request.id, {"contents": [{"uri": uri, "mimeType": "application/json", "text": text}]})

    def _subscribable(self, uri: str, principal: Principal) -> ServedRun | None:
        if not uri.startswith(SUBAGENT_PREFIX):
            return None
        return self._mine(uri[len(SUBAGENT_PREFIX):], principal)

    def _subscribe(self, request: Request, params: Mapping[str, Any], ctx: CallContext) -> Response | ErrorResponse:
        uri = params.get("uri")
        if not isinstance(uri, str):
            return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS, "uri must be a string")
        run = self._subscribable(uri, ctx.principal)
        if run is None:
            if uri == STATUS_URI:
                return Response(request.id, {})  # stable: accepted, and it never changes
            return ErrorResponse(request.id, jsonrpc.RESOURCE_NOT_FOUND, "Resource not found", {"uri": _shown(uri, 1024)})
        assert ctx.session_id is not None
        assert ctx.notify is not None
        if run.final is not None:
            ctx.notify(uri)  # already terminal: one update now closes the spawn→subscribe race
            return Response(request.id, {})
        try:
            self.subscriptions.add(ctx.session_id, uri, ctx.notify)
        except SubscriptionLimit as exc:
            return ErrorResponse(request.id, jsonrpc.INVALID_PARAMS, str(exc), {"uri": uri})
        return Response(request.id, {})

    def listen(self, uris: list[str], sink: Sink, principal: Principal = LOCAL, *, task_ids: tuple[str, ...] = (),
               task_sink: Callable[[dict[str, Any]], None] | None = None) -> ListenTicket:
        """Register a modern listen stream; already-terminal URIs come back to be sent after the ack (only
        ``principal``'s own handles are honored). ``task_ids`` (the tasks extension): the caller's own served
        tasks get ``notifications/tasks`` (their ``tasks/get`` body) when they end; one already ended comes back
        to be sent after the ack. A served task goes from ``working`` to its end only, so that is its one change."""
        ticket = ListenTicket(honored=[], fire_now=[])
        for uri in dict.fromkeys(uris):
            run = self._subscribable(uri, principal)
            if run is None or len(ticket.honored) >= self.limits.max_subscriptions:
                continue
            ticket.honored.append(uri)
            if run.final is not None:
                ticket.fire_now.append(uri)
            else:
                self.subscriptions.add(ticket, uri, sink)
        for task_id in dict.fromkeys(task_ids):
            run = self._mine(task_id, principal)
            if run is None or not run.task or task_sink is None or len(ticket.tasks) >= self.limits.max_subscriptions:
                continue
            ticket.tasks.append(task_id)
            if run.final is not None:
                ticket.tasks_now.append(self._task_body(run, Era.MODERN))
            else:
                self.subscriptions.add((ticket, "tasks"), SUBAGENT_PREFIX + task_id,
                                       self._task_pusher(run, task_sink))
        return ticket

    def _task_pusher(self, run: ServedRun, task_sink: Callable[[dict[str, Any]], None]) -> Sink:
        def pushed(uri: str) -> None:
            task_sink(self._task_body(run, Era.MODERN))
        return pushed

    def unlisten(self, ticket: ListenTicket) -> None:
        self.subscriptions.drop_peer(ticket)
        self.subscriptions.drop_peer((ticket, "tasks"))

    def cancel_request(self, session_id: str, request_id: jsonrpc.RequestId) -> None:
        """``--serve-accept-cancel``: the legacy peer sent ``notifications/cancelled`` for a request of its session;
        the run a sync ``subagent.spawn`` request started ends through the kill ladder (also when the request's
        stream already closed: the notification comes after the peer dropped it). Anything else: nothing."""
        handle = self._by_request.pop((session_id, repr(request_id)), None)
        run = self.runs.get(handle) if handle is not None else None
        if run is None or run.final is not None:
            return
        self.log.info("serve.request", method="notifications/cancelled", handle=run.handle)
        assert self._nursery is not None
        self._nursery.start_soon(self._cancel_detached, run.handle)

    async def _cancel_detached(self, handle: str) -> None:
        """The kill ladder for a run no request waits on: a failure is logged, never the surface's end."""
        try:
            await self.backend.cancel(handle)
        except Exception as exc:
            self.log.error("serve.request", method="notifications/cancelled", handle=handle,
                           error=exc.__class__.__name__)

    def session_closed(self, session_id: str) -> None:
        self.subscriptions.drop_peer(session_id)
        self.subscriptions.drop_peer((session_id, "tasks"))
