"""An A2A peer built on the official ``a2a-sdk`` server (asyncio, uvicorn), for agentd's client interop tests.

Run as ``python -m tests.a2a.sdk_peer [--bearer TOKEN] [--protocol 1.0|0.3] [--extended]``; it prints
``LISTENING <url>``. With ``--extended`` the card offers an authenticated extended card (name ``sdk echo
(extended)``, one more skill) through ``GetExtendedAgentCard``, behind the bearer like every RPC.
Its one skill answers by the first word of the user's text:

- ``fail ...``: the task ends ``TASK_STATE_FAILED`` with a status message;
- ``reject ...``: ``TASK_STATE_REJECTED``;
- ``slow ...``: the task stays ``WORKING`` until cancelled (``CancelTask`` ends it ``CANCELED``);
- ``data ...``: one data artifact ``{"echo": <text>}`` and one file-by-reference part;
- ``drop ...``: streamed, the connection is cut after the first event (:class:`DropStream`); the task goes on
  for a second and completes with the echo, for a client that follows it again with ``SubscribeToTask``;
- anything else: a text artifact ``echo: <text>`` (with the context id), then ``COMPLETED``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys

import uvicorn
from a2a.helpers.proto_helpers import new_data_part, new_task, new_text_message, new_text_part, new_url_part
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.events.event_queue import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, TaskState
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


class EchoExecutor(AgentExecutor):
    def __init__(self) -> None:
        self.cancelled: dict[str, asyncio.Event] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        text = context.get_user_input()
        word = text.split(" ", 1)[0]
        if context.current_task is None:
            await event_queue.enqueue_event(new_task(context.task_id, context.context_id, TaskState.TASK_STATE_SUBMITTED))
        await updater.start_work()
        if word == "fail":
            await updater.failed(new_text_message("the echo agent was asked to fail", role=2))
        elif word == "reject":
            await updater.reject(new_text_message("the echo agent rejects this", role=2))
        elif word == "drop":
            await asyncio.sleep(1.0)  # real time: the peer answers late, after the client dropped its stream
            await updater.add_artifact([new_text_part(f"echo: {text}")], name="echo")
            await updater.complete()
        elif word == "slow":
            done = self.cancelled.setdefault(context.task_id, asyncio.Event())
            await done.wait()
        elif word == "data":
            await updater.add_artifact([new_data_part({"echo": text})], name="data")
            await updater.add_artifact([new_url_part("https://files.example/report.pdf", media_type="application/pdf",
                                                     filename="report.pdf")], name="file")
            await updater.complete()
        else:
            await updater.add_artifact([new_text_part(f"echo: {text} [context {context.context_id}]")], name="echo")
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()
        self.cancelled.setdefault(context.task_id, asyncio.Event()).set()


class Bearer(BaseHTTPMiddleware):
    def __init__(self, app: object, token: str) -> None:
        super().__init__(app)  # type: ignore[arg-type]
        self.token = token

    async def dispatch(self, request: Request, call_next):  # type: ignore[no-untyped-def]
        if request.url.path != "/.well-known/agent-card.json" and (
            request.headers.get("authorization") != f"Bearer {self.token}"
        ):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        response: Response = await call_next(request)
        return response


class DropStream:
    """Cuts a ``SendStreamingMessage`` whose body says ``drop`` after its first SSE event (a lost connection)."""

    def __init__(self, app: object) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)  # type: ignore[operator]
        messages, more = [], True
        while more:
            message = await receive()
            messages.append(message)
            more = message.get("more_body", False)
        body = b"".join(m.get("body", b"") for m in messages)
        replay = iter(messages)

        async def again():  # type: ignore[no-untyped-def]
            return next(replay, None) or await receive()

        if not (b"SendStreamingMessage" in body and b'"drop' in body):
            return await self.app(scope, again, send)  # type: ignore[operator]
        chunks = 0

        async def cut(message):  # type: ignore[no-untyped-def]
            nonlocal chunks
            if message["type"] == "http.response.body" and message.get("body"):
                chunks += 1
                if chunks > 1:
                    raise ConnectionAbortedError("the test cuts this stream")
            await send(message)

        return await self.app(scope, again, cut)  # type: ignore[operator]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bearer")
    parser.add_argument("--protocol", default="1.0")
    parser.add_argument("--broken-card", action="store_true")
    parser.add_argument("--extended", action="store_true")
    args = parser.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    card = AgentCard(
        name="sdk echo",
        description="Echoes what it is told (an a2a-sdk test peer).",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=url + "/", protocol_binding="JSONRPC", protocol_version=args.protocol)],
        capabilities=AgentCapabilities(streaming=True, extended_agent_card=args.extended),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        skills=[AgentSkill(id="echo", name="Echo", description="Repeats the message back.", tags=["echo"])],
    )
    extended = None
    if args.extended:
        extended = AgentCard()
        extended.CopyFrom(card)
        extended.name = "sdk echo (extended)"
        extended.skills.append(AgentSkill(id="secret", name="Members only", description="Only for callers.", tags=[]))
    handler = DefaultRequestHandler(agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card,
                                    extended_agent_card=extended)
    routes = create_jsonrpc_routes(handler, rpc_url="/", enable_v0_3_compat=args.protocol == "0.3")
    if args.broken_card:
        async def broken(request: Request) -> Response:
            return JSONResponse({"name": 7, "skills": "none"})

        from starlette.routing import Route

        routes.append(Route("/.well-known/agent-card.json", broken))
    else:
        routes.extend(create_agent_card_routes(card))
    app = Starlette(routes=routes)
    if args.bearer:
        app.add_middleware(Bearer, token=args.bearer)
    app.add_middleware(DropStream)
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)

    async def serve() -> None:
        sock.listen(128)
        print(f"LISTENING {url}", flush=True)
        await server.serve(sockets=[sock])

    asyncio.run(serve())
    sys.exit(0)


if __name__ == "__main__":
    main()
