"""The served A2A endpoint (``--serve-a2a``): agentd as an A2A agent, next to its self-MCP on one listener.

Mounted by :func:`agentd.selfmcp.serving.serve_self_mcp` under :data:`RPC_PATH` with the card at
:data:`CARD_PATHS`; every request passes the self-MCP's own gate first (Host/Origin, bearer, body limit;
mTLS is the listener's), so A2A adds no weaker door.

Mapping (docs/a2a.md):

- An A2A *context* is a warm session of the supervisor (``served.N``): the first message of a new context
  spawns it through the one spawn chokepoint with origin MANAGEMENT (the same caps and token ceiling as a
  served ``subagent.spawn``); each later message on the context is the session's next turn.
- Each message is a *task*: ``submitted`` -> ``working`` -> ``completed`` with the turn's result as one
  artifact (text, or a data part when the result is JSON), ``failed``/``rejected`` when the run failed or
  the spawn was refused, ``canceled`` after ``CancelTask`` (the kill ladder ends the session).
- Bounds: concurrent turns count against ``--serve-max-spawns`` with the self-MCP's; open contexts are at
  most ``--serve-max-warm`` (the least recently used idle one is closed to make room); finished tasks
  (refused ones included) are kept ``--serve-retention`` at most, and within count and byte bounds per caller
  and in all (:class:`ServedLimits`): the oldest finished task is forgotten first. No timer per task: expired
  tasks are dropped whenever the service is used.
- Tasks and contexts belong to the principal that created them (agentd.transport.tenancy, the one ownership
  rule the self-MCP uses too: the OAuth issuer and subject, else the listener's single principal): another
  principal's task is "not found", ``ListTasks`` pages through the caller's own tasks only (an operator's:
  everyone's), and a context's session lines on ``/events`` are its owner's.
"""

from __future__ import annotations

import base64
import datetime
import json
import math
import secrets as _random
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from typing import Any, Final

import attrs
import trio

from agentd import defaults
from agentd._version import __version__
from agentd.a2a import types as a2a
from agentd.formats import jsontext as json_text
from agentd.mcp import jsonrpc
from agentd.mcp.sse import encode_event
from agentd.selfmcp.backend import RunView
from agentd.supervisor.caps import Refusal
from agentd.supervisor.supervisor import Caller, Origin, SpawnRequest, Supervisor, is_terminal
from agentd.telemetry.events import EventLog, null_log
from agentd.transport.asgi import (
    Receive,
    Scope,
    Send,
    TooLarge,
    discard_body,
    read_body,
    request_headers,
    send_reply,
)
from agentd.transport.asgi_server import McpAsgiApp
from agentd.transport.gate import parse_authority
from agentd.transport.mounts import Mount
from agentd.transport.tenancy import LOCAL, Owners, Principal

RPC_PATH: Final = "/a2a"
CARD_PATHS: Final = frozenset({a2a.CARD_PATH, RPC_PATH + a2a.CARD_PATH})
MANAGEMENT: Final = Caller(origin=Origin.MANAGEMENT)
#: ``ListTasks``: the page size when the client names none, and the most it may ask for (the spec's 1..100).
LIST_PAGE_DEFAULT: Final = 50
LIST_PAGE_MAX: Final = 100


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.frozen
class ServedLimits:
    max_running: int = defaults.SERVE_MAX_SPAWNS
    max_contexts: int = defaults.SERVE_MAX_WARM
    retention: float = defaults.SERVE_RETENTION
    kept_per_caller: int = defaults.SERVE_A2A_KEPT_PER_CALLER
    kept_bytes_per_caller: int = defaults.SERVE_A2A_KEPT_BYTES_PER_CALLER
    kept: int = defaults.SERVE_A2A_KEPT
    kept_bytes: int = defaults.SERVE_A2A_KEPT_BYTES


@attrs.define(eq=False)
class ServedTask:
    id: str
    context_id: str
    #: The principal that created it (agentd.transport.tenancy); only it (and an operator) sees it.
    owner: str = ""
    state: str = "submitted"
    result: Any = None
    reason: str = ""
    changed: trio.Event = attrs.field(factory=trio.Event)
    #: Creation order (``ListTasks`` pages newest first) and the wall-clock time of the last status change.
    seq: int = 0
    updated: float = attrs.field(factory=time.time)
    #: Once finished: when (trio's clock) and its size as JSON, for the retention bounds.
    finished_at: float = 0.0
    size: int = 0

    def update(self, state: str, *, result: Any = None, reason: str = "") -> None:
        self.state, self.result, self.reason = state, result, reason
        self.updated = time.time()
        self.changed.set()
        self.changed = trio.Event()

    @property
    def terminal(self) -> bool:
        return self.state in a2a.TERMINAL

    def to_json(self, *, artifacts: bool = True) -> dict[str, Any]:
        stamp = datetime.datetime.fromtimestamp(self.updated, datetime.UTC).isoformat().replace("+00:00", "Z")
        status: dict[str, Any] = {"state": "TASK_STATE_" + self.state.upper(), "timestamp": stamp}
        if self.reason:
            status["message"] = {"messageId": self.id + "-status", "role": "ROLE_AGENT",
                                 "parts": [{"text": self.reason}]}  # fmt: skip
        body: dict[str, Any] = {"id": self.id, "contextId": self.context_id, "status": status}
        if self.state == "completed" and artifacts:
            body["artifacts"] = [self.artifact()]
        return body

    def artifact(self) -> dict[str, Any]:
        part: dict[str, Any] = {"text": self.result} if isinstance(self.result, str) else {"data": self.result}
        return {"artifactId": self.id + "-result", "name": "result", "parts": [part]}


@attrs.define(eq=False)
class Context:
    id: str
    owner: str = ""
    handle: str | None = None
    busy: bool = True
    last_used: float = 0.0


def _state_of(view: RunView) -> tuple[str, str]:
    """A supervisor view -> (A2A state, reason)."""
    if not is_terminal(view):
        return "completed", ""  # a warm session between turns: the turn is done
    if view.status in ("completed", "partial"):
        return "completed", "partial result" if view.partial or view.status == "partial" else ""
    if view.status == "cancelled":
        return "canceled", "cancelled"
    if view.status == "refused":
        return "rejected", str(view.result or "refused")
    return "failed", f"the run ended {view.status}"


def message_text(message: Mapping[str, Any]) -> str:
    """The user's message as one instruction: text parts, data parts as JSON, files by reference."""
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        raise RpcError(jsonrpc.INVALID_PARAMS, "message.parts must be a non-empty list")
    try:
        rendered = a2a.render_parts([a2a.parse_part(p) for p in parts])
    except a2a.A2aShapeError as exc:
        raise RpcError(jsonrpc.INVALID_PARAMS, str(exc)) from None
    text = "\n".join(rendered).strip()
    if not text:
        raise RpcError(jsonrpc.INVALID_PARAMS, "the message has no text")
    return text


class A2aService:
    """The A2A methods over the daemon's supervisor. ``run`` owns the turn tasks (start it in a nursery)."""

    def __init__(self, supervisor: Supervisor, *, limits: ServedLimits | None = None, log: EventLog | None = None,
                 busy: Any = None, owners: Owners | None = None) -> None:  # fmt: skip
        self.supervisor = supervisor
        #: The served handles' owners, shared with the self-MCP (a context's session is its owner's).
        self.owners = owners if owners is not None else Owners()
        self.limits = limits or ServedLimits()
        self.log = log or null_log()
        #: A callable giving how many served MCP spawns are running (they share --serve-max-spawns).
        self._busy = busy or (lambda: 0)
        self.tasks: dict[str, ServedTask] = {}
        #: The finished tasks, oldest first: all of them, and by owner (with their bytes).
        self._finished: dict[str, ServedTask] = {}
        self._finished_by: dict[str, dict[str, ServedTask]] = {}
        self._bytes_by: dict[str, int] = {}
        self._bytes = 0
        self.contexts: dict[str, Context] = {}
        self._nursery: trio.Nursery | None = None
        self._seq = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def _running(self) -> int:
        return sum(1 for c in self.contexts.values() if c.busy)

    # -- methods ---------------------------------------------------------------------------------------

    def task(self, params: Mapping[str, Any], principal: Principal = LOCAL) -> ServedTask:
        self._expire()
        task_id = params.get("id")
        if not isinstance(task_id, str) or not task_id:
            raise RpcError(jsonrpc.INVALID_PARAMS, "id must be a non-empty string")
        task = self.tasks.get(task_id)
        if task is None or not principal.owns(task.owner):  # another's task is as unknown as a missing one
            raise RpcError(a2a.TASK_NOT_FOUND, "Task not found")
        return task

    def list(self, params: Mapping[str, Any], principal: Principal = LOCAL) -> dict[str, Any]:
        """``ListTasks``: the caller's tasks, newest first, filtered and paged (an opaque token, the last seq)."""
        self._expire()
        size = params.get("pageSize") or LIST_PAGE_DEFAULT
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= LIST_PAGE_MAX:
            raise RpcError(jsonrpc.INVALID_PARAMS, f"pageSize must be an integer from 1 to {LIST_PAGE_MAX}")
        context_id, state, after = params.get("contextId") or None, params.get("status") or None, None
        if context_id is not None and not isinstance(context_id, str):
            raise RpcError(jsonrpc.INVALID_PARAMS, "contextId must be a string")
        if state is not None:
            if not isinstance(state, str) or state.removeprefix("TASK_STATE_").lower() not in a2a.STATES:
                raise RpcError(jsonrpc.INVALID_PARAMS, "status must be a task state")
            state = state.removeprefix("TASK_STATE_").lower()
        if params.get("statusTimestampAfter"):
            try:
                after = datetime.datetime.fromisoformat(str(params["statusTimestampAfter"])).timestamp()
            except ValueError:
                raise RpcError(jsonrpc.INVALID_PARAMS, "statusTimestampAfter must be an RFC 3339 time") from None
        below = math.inf
        if params.get("pageToken"):
            try:
                below = int(base64.urlsafe_b64decode(str(params["pageToken"]).encode()).decode())
            except ValueError:
                raise RpcError(jsonrpc.INVALID_PARAMS, "pageToken is not one this server gave") from None
        matching = sorted(
            (t for t in self.tasks.values() if principal.owns(t.owner) and (context_id is None or t.context_id == context_id)
             and (state is None or t.state == state) and (after is None or t.updated > after)),
            key=lambda t: t.seq, reverse=True,
        )  # fmt: skip
        page = [t for t in matching if t.seq < below][:size]
        more = bool(page) and page[-1].seq > matching[-1].seq
        token = base64.urlsafe_b64encode(str(page[-1].seq).encode()).decode() if more else ""
        artifacts = params.get("includeArtifacts") is True
        return {"tasks": [t.to_json(artifacts=artifacts) for t in page], "nextPageToken": token,
                "pageSize": size, "totalSize": len(matching)}  # fmt: skip

    def _new_task(self, context_id: str, owner: str) -> ServedTask:
        self._seq += 1
        return ServedTask(_random.token_hex(8), context_id, owner, seq=self._seq)

    async def send(self, params: Mapping[str, Any], principal: Principal = LOCAL) -> ServedTask:
        """Start a turn (a new context spawns a warm session); returns the task as submitted."""
        owner = principal.key
        message = params.get("message")
        if not isinstance(message, Mapping):
            raise RpcError(jsonrpc.INVALID_PARAMS, "message must be an object")
        self._expire()
        text = message_text(message)
        context_id = message.get("contextId")
        if context_id is not None and not isinstance(context_id, str):
            raise RpcError(jsonrpc.INVALID_PARAMS, "message.contextId must be a string")
        if message.get("taskId"):
            raise RpcError(a2a.UNSUPPORTED_OPERATION, "continuing a task is not supported; send on its contextId")
        context = self.contexts.get(context_id) if context_id else None
        if context is not None and context.owner != owner:
            raise RpcError(jsonrpc.INVALID_PARAMS, "this contextId is in use; start a new context")
        if context is not None and context.busy:
            raise RpcError(jsonrpc.INVALID_PARAMS, "the context is busy with another task")
        if self._running() + self._busy() >= self.limits.max_running:
            task = self._new_task(context_id or _random.token_hex(8), owner)
            task.update("rejected", reason=f"{self.limits.max_running} served runs already running (limit)")
            self._keep(task)
            return task
        if context is None:
            self._make_room()
            context = Context(context_id or _random.token_hex(8), owner)
            self.contexts[context.id] = context
        context.busy = True
        context.last_used = trio.current_time()
        task = self._new_task(context.id, owner)
        self.tasks[task.id] = task
        assert self._nursery is not None, "A2aService.run must be started first"
        self._nursery.start_soon(self._turn, context, task, text)
        return task

    def _make_room(self) -> None:
        """Close the least recently used idle context when the context limit is reached."""
        while len(self.contexts) >= self.limits.max_contexts:
            idle = [c for c in self.contexts.values() if not c.busy]
            if not idle:
                return  # every context is working: the new one is still admitted; the supervisor caps it
            oldest = min(idle, key=lambda c: c.last_used)
            self._close(oldest, "closed to make room for a new context")

    def _close(self, context: Context, reason: str) -> None:
        self.contexts.pop(context.id, None)
        if context.handle is not None and self._nursery is not None:
            handle = context.handle
            self.owners.forget(handle)
            self._nursery.start_soon(self.supervisor.cancel, MANAGEMENT, handle, reason)

    async def _turn(self, context: Context, task: ServedTask, text: str) -> None:
        task.update("working")
        try:
            if context.handle is None:
                claims = self.owners.claims(context.owner)  # owned from its admission on, first lines included
                answer = await self.supervisor.spawn(MANAGEMENT, SpawnRequest(instruction=text, warm=True,
                                                                              on_admitted=claims))
                if isinstance(answer, Refusal):
                    claims.release()
                    task.update("rejected", reason=answer.message)
                    self.contexts.pop(context.id, None)
                    return
                context.handle = answer.handle
            else:
                sent = await self.supervisor.send(MANAGEMENT, context.handle, text, wait=False)
                if isinstance(sent, Refusal):
                    task.update("rejected", reason=sent.message)
                    return
            self.log.info("a2a.served", method="SendMessage", task_id=task.id, context_id=context.id,
                          handle=context.handle)  # fmt: skip
            view = await self.supervisor.await_(MANAGEMENT, context.handle, timeout=math.inf)
            if isinstance(view, Refusal):
                task.update("failed", reason=view.message)
                return
            if task.terminal:  # cancelled meanwhile
                return
            state, reason = _state_of(view)
            task.update(state, result=view.result, reason=reason)
            if is_terminal(view):
                self.contexts.pop(context.id, None)
                self.owners.forget(context.handle)
        finally:
            context.busy = False
            context.last_used = trio.current_time()
            if not task.terminal:
                task.update("failed", reason="the turn ended without a result")
            self._keep(task)

    def _keep(self, task: ServedTask) -> None:
        """Keep a finished task for ``GetTask``/``ListTasks``, within the bounds (the oldest go first)."""
        self.tasks[task.id] = task
        if task.id in self._finished:
            return
        task.finished_at = trio.current_time()
        task.size = len(json_text.compact_utf8(task.to_json()))
        owned = self._finished_by.setdefault(task.owner, {})
        self._finished[task.id] = owned[task.id] = task
        self._bytes_by[task.owner] = self._bytes_by.get(task.owner, 0) + task.size
        self._bytes += task.size
        limits = self.limits
        while len(owned) > limits.kept_per_caller or self._bytes_by.get(task.owner, 0) > limits.kept_bytes_per_caller:
            self._drop(next(iter(owned.values())))
        while len(self._finished) > limits.kept or self._bytes > limits.kept_bytes:
            self._drop(next(iter(self._finished.values())))
        self._expire()

    def _expire(self) -> None:
        """Forget the finished tasks older than the retention (oldest first: stop at the first young one)."""
        horizon = trio.current_time() - self.limits.retention
        while self._finished:
            oldest = next(iter(self._finished.values()))
            if oldest.finished_at > horizon:
                return
            self._drop(oldest)

    def _drop(self, task: ServedTask) -> None:
        self._finished.pop(task.id, None)
        self.tasks.pop(task.id, None)
        owned = self._finished_by.get(task.owner, {})
        if owned.pop(task.id, None) is not None:
            self._bytes_by[task.owner] -= task.size
            self._bytes -= task.size
        if not owned:
            self._finished_by.pop(task.owner, None)
            self._bytes_by.pop(task.owner, None)

    async def cancel(self, params: Mapping[str, Any], principal: Principal = LOCAL) -> ServedTask:
        task = self.task(params, principal)
        if task.terminal:
            raise RpcError(a2a.TASK_NOT_CANCELABLE, f"Task is {task.state} and cannot be canceled")
        context = self.contexts.pop(task.context_id, None)
        task.update("canceled", reason="cancelled by the client")
        self.log.info("a2a.served", method="CancelTask", task_id=task.id, context_id=task.context_id)
        if context is not None and context.handle is not None:
            self.owners.forget(context.handle)
            with trio.move_on_after(30):
                await self.supervisor.cancel(MANAGEMENT, context.handle, "cancelled by an A2A client")
        return task

    async def wait(self, task: ServedTask) -> ServedTask:
        while not task.terminal:
            await task.changed.wait()
        return task

    async def events(self, task: ServedTask, *, first: bool) -> AsyncGenerator[dict[str, Any], None]:
        """The stream of one task: the task, status updates, then the artifact and the final status."""
        if first:
            yield {"task": {"id": task.id, "contextId": task.context_id,
                            "status": {"state": "TASK_STATE_SUBMITTED"}}}  # fmt: skip
        else:
            yield {"task": task.to_json()}
        seen = "submitted" if first else task.state
        while True:
            if task.state != seen:
                seen = task.state
                if task.state == "completed":
                    yield {"artifactUpdate": {"taskId": task.id, "contextId": task.context_id,
                                              "artifact": task.artifact(), "lastChunk": True}}  # fmt: skip
                status = task.to_json()["status"]
                yield {"statusUpdate": {"taskId": task.id, "contextId": task.context_id, "status": status}}
            if task.terminal:
                return
            await task.changed.wait()


# -- the Agent Card ------------------------------------------------------------------------------------------


def agent_card(*, base_url: str, instruction: str | None, servers: Sequence[str], name: str = "agentd") -> dict[str, Any]:
    """This agent's card: the instruction as its description, one skill for the run and one per MCP server."""
    description = (instruction or "An agentd worker: send it a task as a message.").strip()
    skills = [{"id": "run", "name": "Run a task",
               "description": "Runs the message as a task with this agent's tools and returns the result.",
               "tags": ["agentd"]}]  # fmt: skip
    skills += [{"id": f"mcp-{s}", "name": f"Tools of {s}", "description": f"Can use the tools of MCP server {s!r}.",
                "tags": ["mcp"]} for s in servers]  # fmt: skip
    return {
        "name": name, "description": description[:2000], "version": __version__,
        "supportedInterfaces": [{"url": base_url + RPC_PATH, "protocolBinding": "JSONRPC", "protocolVersion": a2a.V1}],
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    }  # fmt: skip


# -- HTTP -----------------------------------------------------------------------------------------------------


def _error(request_id: Any, code: int, message: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}).encode()


def _ok(request_id: Any, result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}, ensure_ascii=False).encode()


async def _reply(send: Send, status: int, body: bytes, content_type: str = "application/json") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class A2aMount:
    """The A2A endpoint's app on the listener: its paths (:meth:`mounts`) go in front of the listener's table.

    The listener's gate (Host/Origin, bearer or OAuth token) and body bounds are reused as they are, so both
    protocols are guarded by the same rules.
    """

    def __init__(self, mcp: McpAsgiApp, service: A2aService, *, scheme: str, instruction: str | None,
                 servers: Sequence[str], log: EventLog | None = None) -> None:  # fmt: skip
        self.gate = mcp.gate
        self.max_body = mcp.options.max_body
        self.body_timeout = mcp.options.body_timeout
        self.service = service
        self.scheme = scheme
        self.instruction = instruction
        self.servers = tuple(servers)
        self.log = log or null_log()

    def mounts(self) -> list[Mount]:
        """The A2A paths (with trailing slashes too), for :meth:`McpAsgiApp.mount`."""
        return [Mount(path, self, slashes=True) for path in sorted(CARD_PATHS | {RPC_PATH})]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        headers = request_headers(scope)
        principal = await self.gate.admit(headers)
        if not isinstance(principal, Principal):
            await send_reply(send, principal)
            return
        if path.rstrip("/") in CARD_PATHS:
            if scope["method"] != "GET":
                await _reply(send, 405, b"method not allowed", "text/plain")
                return
            # the gate let only a well-formed Host through; the card names it as parsed, never as sent
            authority = parse_authority(headers.get("host", ""))
            base = f"{self.scheme}://{authority if authority is not None else 'localhost'}"
            card = agent_card(base_url=base, instruction=self.instruction, servers=self.servers)
            await _reply(send, 200, json.dumps(card, ensure_ascii=False).encode())
            return
        if scope["method"] != "POST":
            await _reply(send, 405, b"method not allowed", "text/plain")
            return
        try:
            body = await read_body(headers, receive, limit=self.max_body, timeout=self.body_timeout)
        except TooLarge:
            self.log.info("serve.refused", reason="body_too_large", limit=self.max_body)
            await discard_body(headers, receive)
            await _reply(send, 413, _error(None, jsonrpc.INVALID_REQUEST,
                                           f"request body exceeds {self.max_body} bytes"))  # fmt: skip
            return
        except trio.TooSlowError:
            await _reply(send, 408, _error(None, jsonrpc.INVALID_REQUEST, "request body too slow"))
            return
        await self._rpc(body, send, principal)

    async def _rpc(self, body: bytes, send: Send, principal: Principal = LOCAL) -> None:
        try:
            message = json_text.loads(body, "reject")  # lone surrogates and deep nesting refused
        except (ValueError, UnicodeDecodeError):
            await _reply(send, 200, _error(None, jsonrpc.PARSE_ERROR, "Parse error"))
            return
        if not isinstance(message, dict):
            await _reply(send, 200, _error(None, jsonrpc.INVALID_REQUEST, "Invalid Request: not a single object"))
            return
        request_id = message.get("id")
        if message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str) or not (
            isinstance(request_id, str | int) and not isinstance(request_id, bool)
        ):
            safe_id = request_id if isinstance(request_id, str | int) and not isinstance(request_id, bool) else None
            await _reply(send, 200, _error(safe_id, jsonrpc.INVALID_REQUEST, "Invalid Request"))
            return
        method, params = message["method"], message.get("params") or {}
        if not isinstance(params, dict):
            await _reply(send, 200, _error(request_id, jsonrpc.INVALID_PARAMS, "params must be an object"))
            return
        try:
            if method == "SendMessage":
                task = await self.service.send(params, principal)
                configuration = params.get("configuration") or {}
                if not (isinstance(configuration, dict) and configuration.get("returnImmediately")):
                    await self.service.wait(task)
                await _reply(send, 200, _ok(request_id, {"task": task.to_json()}))
            elif method == "GetTask":
                await _reply(send, 200, _ok(request_id, self.service.task(params, principal).to_json()))
            elif method == "ListTasks":
                await _reply(send, 200, _ok(request_id, self.service.list(params, principal)))
            elif method == "CancelTask":
                await _reply(send, 200, _ok(request_id, (await self.service.cancel(params, principal)).to_json()))
            elif method in ("SendStreamingMessage", "SubscribeToTask"):
                if method == "SendStreamingMessage":
                    task, first = await self.service.send(params, principal), True
                else:
                    task, first = self.service.task(params, principal), False
                    if task.terminal:
                        raise RpcError(a2a.UNSUPPORTED_OPERATION, f"Task is {task.state}; nothing to subscribe to")
                await self._stream(send, request_id, self.service.events(task, first=first))
            else:
                await _reply(send, 200, _error(request_id, jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}"[:200]))
        except RpcError as exc:
            await _reply(send, 200, _error(request_id, exc.code, exc.message))

    async def _stream(self, send: Send, request_id: Any, events: AsyncGenerator[dict[str, Any], None]) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        async with aclosing(events):  # a peer that goes away mid-stream closes the events here, not in the GC
            async for event in events:
                frame = encode_event(_ok(request_id, event).decode())
                await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
