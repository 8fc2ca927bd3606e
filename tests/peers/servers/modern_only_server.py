"""An MCP test peer that speaks ONLY 2026-07-28: a small raw ASGI app on hypercorn's trio worker.

No ``initialize`` (HTTP 400, JSON-RPC -32022 with ``data.supported == ["2026-07-28"]``), no sessions, no GET
stream (405 on GET/DELETE). Every request must carry the ``_meta`` envelope and the ``MCP-Protocol-Version``,
``Mcp-Method`` (and, for ``tools/call``/``resources/read``, ``Mcp-Name``) headers. Results carry
``resultType: "complete"``; ``subscriptions/listen`` answers with an SSE stream whose first frame is the ack and
whose every frame has ``_meta["io.modelcontextprotocol/subscriptionId"]``. Closing a request's response is
cancellation (recorded, see ``/_test/cancelled``).

Side doors: ``POST /_test/bump?uri=``, ``POST /_test/add_tool?name=``, ``GET /_test/cancelled``,
``POST /_test/close_listens`` (graceful: final result frame, then end), ``POST /_test/drop_listens`` (abrupt),
``GET /_test/stats`` (open listens, requests by method, request ids by method),
``POST /_test/break_next?rpc=&count=&how=abort|end`` (the next ``count`` requests of method ``rpc`` get an SSE
response that carries a progress notification and then breaks: ``abort`` resets the connection mid-stream,
``end`` closes the stream cleanly, both before the answer).

Test-only tool ``break_stream`` and resource ``test://broken``: their response stream always breaks (abort)
before the answer; every ``break_stream`` call that reached the server is counted (``stats.broken_calls``).

With ``--tasks`` the peer speaks the tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663, as written for
2026-07-28): it declares the extension in ``server/discover`` and lists ``research`` (``topic``, ``seconds``,
``ask``), which it always runs as a task: ``resultType: "task"`` to a call declaring the extension in its
per-request client capabilities, -32021 naming the extension to one that does not. ``tasks/get`` reports
``working`` (a percentage as ``statusMessage``) until ``seconds`` passed since the call, then ``completed`` with
the result inline; with ``ask`` the task goes ``input_required`` half way (one elicitation, key ``confirm``) until
a ``tasks/update`` answers it. ``tasks/cancel`` marks the task ``cancelled``. ``tasks/*`` requests must declare
the extension (else -32021) and carry ``Mcp-Name: <taskId>`` (else -32020); an unknown task is -32602.
``GET /_test/tasks`` shows every task, the ``tasks/update`` answers and the cancelled ids; ``POST
/_test/finish_tasks`` makes every task not cancelled done now (its next ``tasks/get`` reports the end).

With ``--push-tasks`` (and ``--tasks``) it also pushes task status as the extension describes: a
``subscriptions/listen`` whose filter names ``taskIds`` (declaring the extension, else -32021) is acknowledged with
the ids it knows, and each of those tasks that reaches ``completed`` (without ``ask``) gets one
``notifications/tasks`` carrying the task as ``tasks/get`` shows it; ``GET /_test/tasks`` lists the ``taskIds``
each such listen asked for (``listens``) and the notifications sent (``pushed``).
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import sys
import uuid
from typing import Any
from urllib.parse import parse_qs

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

VERSION = "2026-07-28"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPS = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
META_SUBSCRIPTION = "io.modelcontextprotocol/subscriptionId"
SERVER_INFO = {"name": "agentd-modern-test-peer", "version": "1.0.0"}
CAPABILITIES = {"tools": {"listChanged": True}, "resources": {"subscribe": True, "listChanged": True}}
TASKS_EXT = "io.modelcontextprotocol/tasks"
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
HEADER_MISMATCH, MISSING_CAPABILITY, UNSUPPORTED_VERSION = -32020, -32021, -32022


class RpcError(Exception):
    def __init__(self, http_status: int, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.http_status, self.code, self.message, self.data = http_status, code, message, data

    def body(self, rid: Any) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return {"jsonrpc": "2.0", "id": rid, "error": error}


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


def _decode_header_value(value: str) -> str:
    """``=?base64?...?=`` wraps values that are not safe as a plain header."""
    if value.startswith("=?base64?") and value.endswith("?="):
        return base64.b64decode(value[len("=?base64?"):-2]).decode()
    return value


class ModernPeer:
    def __init__(self, *, filler_tools: int, page_size: int, keepalive: float, tasks: bool = False,
                 poll_ms: int = 200, push_tasks: bool = False) -> None:
        self.page_size = page_size
        self.with_tasks, self.poll_ms, self.push_tasks = tasks, poll_ms, push_tasks
        self.task_listens: list[list[str]] = []
        self.tasks_pushed: list[str] = []
        self.tasks: dict[str, dict[str, Any]] = {}
        self.task_updates: list[dict[str, Any]] = []
        self.tasks_cancelled: list[str] = []
        self.keepalive = keepalive
        self.counters: dict[str, int] = {"test://counter": 0}
        self.cancelled: list[dict[str, Any]] = []
        self.requests: dict[str, int] = {}
        self.request_ids: dict[str, list[Any]] = {}
        self.breaks: dict[str, tuple[int, str]] = {}
        self.broken_calls = 0
        self.listens: dict[int, tuple[Any, frozenset[str], bool, bool, trio.MemorySendChannel[Any]]] = {}
        self._next_listen = 0
        self.tools: list[dict[str, Any]] = [
            {"name": "echo", "description": "Echo the text back.",
             "inputSchema": _schema({"text": {"type": "string"}}, ["text"])},
            {"name": "add", "description": "Add two integers.",
             "inputSchema": _schema({"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
             "outputSchema": _schema({"sum": {"type": "integer"}}, ["sum"])},
            {"name": "slow", "description": "Sleep, then answer; a closed response is recorded as cancellation.",
             "inputSchema": _schema({"seconds": {"type": "number"}}, ["seconds"])},
            {"name": "bump", "description": "Increment a counter resource and notify listeners.",
             "inputSchema": _schema({"uri": {"type": "string"}}, [])},
            {"name": "break_stream", "description": "Test-only: the response stream always breaks before the answer.",
             "inputSchema": _schema({}, [])},
        ]
        if tasks:
            self.tools.append({
                "name": "research", "description": "A long job, always run as a task (the tasks extension).",
                "inputSchema": _schema({"topic": {"type": "string"}, "seconds": {"type": "number"},
                                        "ask": {"type": "boolean"}}, ["topic"])})
        self.tools += [{"name": f"filler_{i:04d}", "description": f"Filler tool {i}.", "inputSchema": _schema({}, [])}
                       for i in range(filler_tools)]
        self.resources = [
            {"uri": "test://static", "name": "static", "mimeType": "text/plain"},
            {"uri": "test://counter", "name": "counter", "mimeType": "application/json"},
            {"uri": "test://broken", "name": "broken", "mimeType": "text/plain"},
        ]

    # -- ASGI ------------------------------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    for _, _, _, _, channel in list(self.listens.values()):
                        channel.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path.startswith("/_test/"):
            await self.side_door(path, method, scope, send)
        elif path != "/mcp":
            await _plain(send, 404, b"not found")
        elif method != "POST":
            await _plain(send, 405, b"method not allowed", [(b"allow", b"POST")])
        else:
            await self.post(scope, receive, send)

    async def post(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            msg = json.loads(body)
        except ValueError:
            await _json(send, 400, RpcError(400, PARSE_ERROR, "Parse error").body(None))
            return
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str):
            await _json(send, 400, RpcError(400, INVALID_REQUEST, "Invalid request").body(None))
            return
        if "id" not in msg:
            await _plain(send, 202, b"")
            return
        rid, rpc_method = msg["id"], msg["method"]
        self.requests[rpc_method] = self.requests.get(rpc_method, 0) + 1
        self.request_ids.setdefault(rpc_method, []).append(rid)
        accept = headers.get("accept", "")
        try:
            params = msg.get("params") or {}
            if rpc_method == "initialize":
                requested = params.get("protocolVersion") if isinstance(params, dict) else None
                raise RpcError(400, UNSUPPORTED_VERSION, "Unsupported protocol version: this server speaks only "
                               f"{VERSION}", {"supported": [VERSION], "requested": requested})
            self.check_envelope(rpc_method, params, headers)
            if "application/json" not in accept and "*/*" not in accept:
                await _plain(send, 406, b"Not Acceptable: application/json required")
                return
            how = self._take_break(rpc_method, params)
            if how is not None:
                await _break_stream(send, rid, how, listen=rpc_method == "subscriptions/listen")
                return
            if rpc_method == "subscriptions/listen":
                if "text/event-stream" not in accept:
                    await _plain(send, 406, b"Not Acceptable: text/event-stream required")
                    return
                await self.listen(rid, params, receive, send)
                return
            if rpc_method in TASK_METHODS and self.with_tasks:
                result = self.task_method(rpc_method, params)
                result.setdefault("resultType", "complete")
                await _json(send, 200, {"jsonrpc": "2.0", "id": rid, "result": result})
                return
            stream = self.streams().get(rpc_method)
            if stream is not None:
                await stream(rid, params, receive, send)
                return
            handler = self.handlers().get(rpc_method)
            if handler is None:
                raise RpcError(404, METHOD_NOT_FOUND, f"Method not found: {rpc_method}")
            result = await _cancel_on_disconnect(receive, functools.partial(handler, params),
                                                 on_cancel=functools.partial(self._record_cancel, rid, rpc_method))
            if result is None:
                return
        except RpcError as err:
            await _json(send, err.http_status, err.body(rid))
            return
        result.setdefault("resultType", "complete")
        result.setdefault("_meta", {})[META_SERVER_INFO] = SERVER_INFO
        await _json(send, 200, {"jsonrpc": "2.0", "id": rid, "result": result})

    def streams(self) -> dict[str, Any]:
        """Requests answered with a stream of their own, by method: ``(rid, params, receive, send)``."""
        return {}

    def handlers(self) -> dict[str, Any]:
        """The request handlers by method (a subclass adds its own: tests/peers/servers/events_server.py)."""
        return {
            "server/discover": self.discover,
            "tools/list": self.tools_list,
            "tools/call": self.tools_call,
            "resources/list": self.resources_list,
            "resources/read": self.resources_read,
        }

    def check_envelope(self, method: str, params: Any, headers: dict[str, str]) -> None:
        meta = params.get("_meta") if isinstance(params, dict) else None
        if not isinstance(meta, dict) or META_VERSION not in meta:
            raise RpcError(400, INVALID_PARAMS, f"missing _meta[{META_VERSION!r}]")
        if not isinstance(meta.get(META_CAPS), dict):
            raise RpcError(400, INVALID_PARAMS, f"missing _meta[{META_CAPS!r}]")
        version = meta[META_VERSION]
        if headers.get("mcp-protocol-version") != version:
            raise RpcError(400, HEADER_MISMATCH, "MCP-Protocol-Version header does not match _meta")
        if headers.get("mcp-method") != method:
            raise RpcError(400, HEADER_MISMATCH, "Mcp-Method header does not match the body")
        if method in ("tools/call", "resources/read", "prompts/get", *TASK_METHODS):
            expected = params.get("uri") if method == "resources/read" else params.get(
                "taskId" if method in TASK_METHODS else "name")
            name = headers.get("mcp-name")
            if name is None or _decode_header_value(name) != expected:
                raise RpcError(400, HEADER_MISMATCH, "Mcp-Name header does not match the body")
        if version != VERSION:
            raise RpcError(400, UNSUPPORTED_VERSION, f"Unsupported protocol version: {version}",
                           {"supported": [VERSION], "requested": version})

    # -- methods ---------------------------------------------------------------------------------------------------

    async def discover(self, params: dict[str, Any]) -> dict[str, Any]:
        capabilities = {**CAPABILITIES, "extensions": {TASKS_EXT: {}}} if self.with_tasks else CAPABILITIES
        return {"supportedVersions": [VERSION], "capabilities": capabilities, "serverInfo": SERVER_INFO,
                "instructions": "Modern-only test peer.", "ttlMs": 0, "cacheScope": "private"}

    def _page(self, items: list[dict[str, Any]], params: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
        cursor = params.get("cursor")
        start = 0
        if cursor is not None:
            if not isinstance(cursor, str) or not cursor.isdigit() or int(cursor) > len(items):
                raise RpcError(200, INVALID_PARAMS, f"invalid cursor {cursor!r}")
            start = int(cursor)
        if self.page_size <= 0:
            return items[start:], None
        end = start + self.page_size
        return items[start:end], (str(end) if end < len(items) else None)

    async def tools_list(self, params: dict[str, Any]) -> dict[str, Any]:
        page, cursor = self._page(self.tools, params)
        result: dict[str, Any] = {"tools": page, "ttlMs": 0, "cacheScope": "private"}
        if cursor:
            result["nextCursor"] = cursor
        return result

    async def tools_call(self, params: dict[str, Any]) -> dict[str, Any]:
        name, args = params.get("name"), params.get("arguments") or {}
        if name == "echo":
            return {"content": [{"type": "text", "text": str(args.get("text", ""))}], "isError": False}
        if name == "add":
            total = int(args["a"]) + int(args["b"])
            return {"content": [{"type": "text", "text": str(total)}], "structuredContent": {"sum": total},
                    "isError": False}
        if name == "slow":
            seconds = float(args.get("seconds", 1.0))
            await trio.sleep(seconds)  # real time: the peer's slow tool, a call in flight for a real client
            return {"content": [{"type": "text", "text": f"slept {seconds}"}], "isError": False}
        if name == "research" and self.with_tasks:
            return self.create_task(params, args)
        if name == "bump":
            uri = str(args.get("uri") or "test://counter")
            value = self.bump(uri)
            return {"content": [{"type": "text", "text": f"{uri}={value}"}], "structuredContent": {"value": value},
                    "isError": False}
        if any(t["name"] == name for t in self.tools):
            return {"content": [{"type": "text", "text": f"{name} ok"}], "isError": False}
        raise RpcError(200, INVALID_PARAMS, f"Unknown tool: {name}")

    async def resources_list(self, params: dict[str, Any]) -> dict[str, Any]:
        page, cursor = self._page(self.resources, params)
        result: dict[str, Any] = {"resources": page, "ttlMs": 0, "cacheScope": "private"}
        if cursor:
            result["nextCursor"] = cursor
        return result

    async def resources_read(self, params: dict[str, Any]) -> dict[str, Any]:
        uri = params.get("uri")
        if uri == "test://static":
            contents = [{"uri": uri, "mimeType": "text/plain", "text": "static text"}]
        elif isinstance(uri, str) and uri in self.counters:
            contents = [{"uri": uri, "mimeType": "application/json", "text": json.dumps(self.counters[uri])}]
        else:
            raise RpcError(200, INVALID_PARAMS, "Resource not found", {"uri": uri})
        return {"contents": contents, "ttlMs": 0, "cacheScope": "private"}

    # -- the tasks extension ---------------------------------------------------------------------------------------

    @staticmethod
    def _require_extension(params: dict[str, Any]) -> None:
        caps = params["_meta"][META_CAPS]
        extensions = caps.get("extensions") if isinstance(caps, dict) else None
        if not isinstance(extensions, dict) or not isinstance(extensions.get(TASKS_EXT), dict):
            raise RpcError(200, MISSING_CAPABILITY, "Missing required client capability",
                           {"requiredCapabilities": {"extensions": {TASKS_EXT: {}}}})

    def create_task(self, params: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        self._require_extension(params)
        task_id = f"task-{uuid.uuid4()}"
        self.tasks[task_id] = {"topic": str(args.get("topic", "")), "seconds": float(args.get("seconds", 1.0)),
                               "ask": bool(args.get("ask", False)), "answer": None, "cancelled": False,
                               "started": trio.current_time()}
        return {"resultType": "task", **self._task_view(task_id)}

    def _task_view(self, task_id: str) -> dict[str, Any]:
        task = self.tasks[task_id]
        view: dict[str, Any] = {"taskId": task_id, "createdAt": "2026-12-06T00:00:00Z",
                                "lastUpdatedAt": "2026-12-06T00:00:00Z", "ttlMs": 600_000,
                                "pollIntervalMs": self.poll_ms}
        elapsed = trio.current_time() - task["started"]
        if task["cancelled"]:
            view["status"] = "cancelled"
        elif task["ask"] and task["answer"] is None and elapsed >= task["seconds"] / 2:
            view["status"], view["statusMessage"] = "input_required", "waiting for confirmation"
            view["inputRequests"] = {"confirm": {"method": "elicitation/create", "params": {
                "mode": "form", "message": f"Research {task['topic']!r}?",
                "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}}}
        elif elapsed >= task["seconds"] and (not task["ask"] or task["answer"] is not None):
            view["status"] = "completed"
            text = f"researched {task['topic']}" + (f" (answer: {json.dumps(task['answer'])})" if task["ask"] else "")
            view["result"] = {"content": [{"type": "text", "text": text}], "isError": False}
        else:
            view["status"] = "working"
            view["statusMessage"] = f"{min(99, int(100 * elapsed / max(task['seconds'], 0.001)))}%"
        return view

    def task_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._require_extension(params)
        task_id = params.get("taskId")
        if not isinstance(task_id, str) or task_id not in self.tasks:
            raise RpcError(200, INVALID_PARAMS, "Failed to retrieve task: Task not found")
        task = self.tasks[task_id]
        if method == "tasks/get":
            return self._task_view(task_id)
        if method == "tasks/update":
            responses = params.get("inputResponses")
            self.task_updates.append({"taskId": task_id, "inputResponses": responses})
            if isinstance(responses, dict) and "confirm" in responses and task["answer"] is None:
                task["answer"] = responses["confirm"]
            return {}
        if not task["cancelled"]:
            task["cancelled"] = True
            self.tasks_cancelled.append(task_id)
        return {}

    def _take_break(self, method: str, params: dict[str, Any]) -> str | None:
        """How this request's response stream must break, if it must."""
        if method == "tools/call" and params.get("name") == "break_stream":
            self.broken_calls += 1
            return "abort"
        if method == "resources/read" and params.get("uri") == "test://broken":
            return "abort"
        count, how = self.breaks.get(method, (0, "abort"))
        if count <= 0:
            return None
        self.breaks[method] = (count - 1, how)
        return how

    def _record_cancel(self, rid: Any, method: str) -> None:
        self.cancelled.append({"requestId": rid, "reason": None, "via": "disconnect", "method": method})

    # -- subscriptions ---------------------------------------------------------------------------------------------

    def bump(self, uri: str) -> int:
        self.counters[uri] = self.counters.get(uri, 0) + 1
        self.publish({"method": "notifications/resources/updated", "params": {"uri": uri}}, uri=uri)
        return self.counters[uri]

    def add_tool(self, name: str | None) -> str:
        tool_name = name or f"added_{len(self.tools)}"
        self.tools.append({"name": tool_name, "description": "Added at runtime.", "inputSchema": _schema({}, [])})
        self.publish({"method": "notifications/tools/list_changed", "params": {}}, tools=True)
        return tool_name

    def publish(self, note: dict[str, Any], *, uri: str | None = None, tools: bool = False,
                resources: bool = False) -> None:
        for _, uris, want_tools, want_resources, channel in list(self.listens.values()):
            if (uri is not None and uri in uris) or (tools and want_tools) or (resources and want_resources):
                try:
                    channel.send_nowait(note)
                except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                    pass

    async def listen(self, rid: Any, params: dict[str, Any], receive: Any, send: Any) -> None:
        wanted = params.get("notifications")
        if not isinstance(wanted, dict):
            raise RpcError(400, INVALID_PARAMS, "subscriptions/listen requires params.notifications")
        uris = [u for u in wanted.get("resourceSubscriptions") or [] if isinstance(u, str)]
        want_tools = wanted.get("toolsListChanged") is True
        want_resources = wanted.get("resourcesListChanged") is True
        honored: dict[str, Any] = {}
        if want_tools:
            honored["toolsListChanged"] = True
        if want_resources:
            honored["resourcesListChanged"] = True
        if uris:
            honored["resourceSubscriptions"] = uris
        task_ids: list[str] = []
        if self.push_tasks and wanted.get("taskIds"):
            caps = params.get("_meta", {}).get(META_CAPS)
            extensions = caps.get("extensions") if isinstance(caps, dict) else None
            if not isinstance(extensions, dict) or not isinstance(extensions.get(TASKS_EXT), dict):
                raise RpcError(400, MISSING_CAPABILITY, "Missing required client capability",
                               {"requiredCapabilities": {"extensions": {TASKS_EXT: {}}}})
            task_ids = [t for t in wanted["taskIds"] if isinstance(t, str) and t in self.tasks]
            honored["taskIds"] = task_ids
            self.task_listens.append(list(wanted["taskIds"]))
        send_ch, recv_ch = trio.open_memory_channel[Any](256)
        key = self._next_listen
        self._next_listen += 1
        self.listens[key] = (rid, frozenset(uris), want_tools, want_resources, send_ch)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]})
            ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                   "params": {"_meta": {META_SUBSCRIPTION: rid}, "notifications": honored}}
            await _sse(send, ack)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
                nursery.start_soon(self._keepalive, send)
                for task_id in task_ids:
                    nursery.start_soon(self._push_when_done, task_id, send_ch)
                async for note in recv_ch:
                    if note == "drop":
                        nursery.cancel_scope.cancel()
                        break
                    frame = {"jsonrpc": "2.0", "method": note["method"],
                             "params": {**note["params"], "_meta": {META_SUBSCRIPTION: rid}}}
                    await _sse(send, frame)
                else:
                    final = {"jsonrpc": "2.0", "id": rid,
                             "result": {"resultType": "complete", "_meta": {META_SUBSCRIPTION: rid}}}
                    await _sse(send, final)
                nursery.cancel_scope.cancel()
        finally:
            self.listens.pop(key, None)
            send_ch.close()
        # End the response (after a graceful close, a drop, or a client disconnect); bounded and shielded.
        with trio.move_on_after(1, shield=True):
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:
                pass

    async def _push_when_done(self, task_id: str, channel: Any) -> None:
        """One ``notifications/tasks`` when the task completes (a task that asks is left to polling)."""
        task = self.tasks[task_id]
        if task["ask"] or task["cancelled"]:
            return
        await trio.sleep_until(task["started"] + task["seconds"])  # real time: the fixture's task runs this long
        view = self._task_view(task_id)
        if view["status"] == "completed":
            self.tasks_pushed.append(task_id)
            channel.send_nowait({"method": "notifications/tasks", "params": view})

    async def _keepalive(self, send: Any) -> None:
        while True:
            await trio.sleep(self.keepalive)  # real time: the peer's keep-alive interval on a real stream
            await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})

    # -- side doors ------------------------------------------------------------------------------------------------

    async def side_door(self, path: str, method: str, scope: dict[str, Any], send: Any) -> None:
        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        if path == "/_test/bump" and method == "POST":
            await _json(send, 200, {"value": self.bump(query.get("uri", "test://counter"))})
        elif path == "/_test/add_tool" and method == "POST":
            await _json(send, 200, {"name": self.add_tool(query.get("name"))})
        elif path == "/_test/cancelled":
            await _json(send, 200, self.cancelled)
        elif path == "/_test/close_listens" and method == "POST":
            n = len(self.listens)
            for _, _, _, _, channel in list(self.listens.values()):
                channel.close()
            await _json(send, 200, {"closed": n})
        elif path == "/_test/drop_listens" and method == "POST":
            n = len(self.listens)
            for _, _, _, _, channel in list(self.listens.values()):
                try:
                    channel.send_nowait("drop")
                except (trio.WouldBlock, trio.ClosedResourceError):
                    pass
            await _json(send, 200, {"dropped": n})
        elif path == "/_test/break_next" and method == "POST":
            self.breaks[query["rpc"]] = (int(query.get("count", "1")), query.get("how", "abort"))
            await _json(send, 200, {"rpc": query["rpc"]})
        elif path == "/_test/finish_tasks" and method == "POST":
            finished = [task_id for task_id, task in self.tasks.items() if not task["cancelled"]]
            for task_id in finished:
                self.tasks[task_id]["seconds"] = 0.0
            await _json(send, 200, {"finished": finished})
        elif path == "/_test/tasks":
            await _json(send, 200, {"tasks": {task_id: self._task_view(task_id) for task_id in self.tasks},
                                    "updates": self.task_updates, "cancelled": self.tasks_cancelled,
                                    "listens": self.task_listens, "pushed": self.tasks_pushed})
        elif path == "/_test/stats":
            await _json(send, 200, {"listens": len(self.listens), "requests": self.requests,
                                    "request_ids": self.request_ids, "broken_calls": self.broken_calls})
        else:
            await _plain(send, 404, b"not found")


async def _cancel_on_disconnect(receive: Any, work: Any, *, on_cancel: Any) -> Any:
    """Run ``work`` unless the client closes the connection first (closing the response IS cancellation)."""
    result: Any = None
    failure: RpcError | None = None
    disconnected = False
    async with trio.open_nursery() as nursery:
        async def watch() -> None:
            nonlocal disconnected
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected = True
                    nursery.cancel_scope.cancel()
                    return

        async def run() -> None:
            nonlocal result, failure
            try:
                result = await work()
            except RpcError as err:  # carried out of the nursery bare, not in an ExceptionGroup
                failure = err
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        nursery.start_soon(run)
    if disconnected:
        on_cancel()
        return None
    if failure is not None:
        raise failure
    return result


class _AbortStream(Exception):
    """Raised out of the ASGI app mid-response: hypercorn drops the connection without ending the body."""


async def _break_stream(send: Any, rid: Any, how: str, *, listen: bool = False) -> None:
    """Start an SSE response, send one progress notification (not on a listen), then break before the answer."""
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
    if not listen:  # a listen stream carries only its acknowledgement and change notifications
        await _sse(send, {"jsonrpc": "2.0", "method": "notifications/progress",
                          "params": {"progressToken": f"p-{rid}", "progress": 1}})
    if how == "end":
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    await send({"type": "http.response.body", "body": b"event: message\ndata: {\"jsonrpc\":", "more_body": True})
    raise _AbortStream(f"test peer: breaking the response stream of request {rid!r}")


async def _watch_disconnect(receive: Any, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _sse(send: Any, payload: dict[str, Any]) -> None:
    data = json.dumps(payload, separators=(",", ":")).encode()
    await send({"type": "http.response.body", "body": b"event: message\ndata: " + data + b"\n\n", "more_body": True})


async def _json(send: Any, status: int, payload: Any) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _plain(send: Any, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


async def main(args: argparse.Namespace) -> None:
    app = ModernPeer(filler_tools=args.tools, page_size=args.page_size, keepalive=args.keepalive, tasks=args.tasks,
                     poll_ms=args.poll_ms, push_tasks=args.push_tasks)
    config = Config()
    config.bind = [f"{args.host}:{args.port}"]
    config.loglevel = "WARNING"
    config.accesslog = None
    config.graceful_timeout = 1
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, app, config, mode="asgi"))  # type: ignore[arg-type]
        url = binds[0] if binds else f"http://{args.host}:{args.port}"
        print(f"LISTENING {url}/mcp", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="MCP 2026-07-28-only test peer")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tools", type=int, default=0)
    p.add_argument("--page-size", type=int, default=0)
    p.add_argument("--keepalive", type=float, default=15.0, help="seconds between ': ping' comments on listens")
    p.add_argument("--tasks", action="store_true", help="speak the tasks extension; list the task tool research")
    p.add_argument("--poll-ms", type=int, default=200, help="the pollIntervalMs the tasks suggest")
    p.add_argument("--push-tasks", action="store_true", help="push notifications/tasks on listens naming taskIds")
    return p.parse_args(argv)


if __name__ == "__main__":
    try:
        trio.run(main, parse_args())
    except KeyboardInterrupt:
        sys.exit(0)
