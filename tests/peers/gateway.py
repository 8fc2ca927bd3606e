"""A scripted OpenAI-compatible Chat Completions gateway: a real HTTP server on 127.0.0.1 for tests.

It replays scripted replies and records every request (headers and JSON body). Two ways to run it:

In a trio test (virtual time works: delays are ``trio.sleep``)::

    async with scripted_gateway([text("hi")]) as gw:
        gw.url              # base URL, "http://127.0.0.1:PORT/v1" (the client appends /chat/completions)
        gw.requests         # list[RecordedRequest], in arrival order
        gw.push(reply, ...) # more replies for the queue

As a program, for end-to-end CLI tests (prints ``LISTENING <base-url>`` like every peer in tests/peers)::

    python -m tests.peers.gateway --script script.json [--record requests.jsonl] [--port 0]

The script file is a JSON list of replies, or ``{"replies": [...], "rules": [...], "default": {...}}``; every
request is appended to the record file as one JSON line ``{"method", "path", "headers", "body"}``.

Choosing a reply for a request: the first *rule* whose ``match`` fits (and whose ``times`` is not used up),
else the next reply in the queue, else ``default``, else HTTP 500 ``script exhausted``.

A reply is a dict (build one with the helpers below) or, in-process, a callable ``(RecordedRequest) -> dict``:

=================  ==================================================================================
``content``        final assistant text
``tool_calls``     ``[{"name", "arguments": str | dict, "id"?}]`` (ids default to ``call_<n>``)
``usage``          ``{"prompt_tokens", "completion_tokens"}`` (default 10 and 5; ``null`` omits it)
``finish_reason``  default ``tool_calls`` or ``stop``
``stream``         force SSE (true) or JSON (false); default: whatever the request asked for
``chunk``          characters per streamed content/argument fragment (default 7)
``chunk_delay``    streaming: seconds to wait after each event (a reply that arrives slowly)
``cut``            streaming: stop mid-event, no ``[DONE]`` (a broken stream); ``"event"``: stop cleanly
                   between events, before ``finish_reason`` and ``[DONE]``
``stall``          streaming: send this many events, then hold the stream open, sending nothing more, until
                   the client goes (a reply cut by the client's deadline or cancellation)
``usage_first``    streaming: send the usage chunk right after the first event (gateways that report usage
                   as they go), not last
``status``         HTTP status (with ``headers``, e.g. ``{"Retry-After": "1"}``); an OpenAI error body
``raw``            the exact body text (malformed replies), with ``content_type``
``json``           the exact JSON body
``delay``          seconds to wait before answering
``echo_last``      answer with the last message's text as ``content`` (e.g. echo a tool observation)
``wait``           in-process only: an object with ``async wait()`` (a ``trio.Event``) awaited before answering,
                   so a test holds a model request open until it says so
=================  ==================================================================================

Rule ``match`` keys (all given must hold): ``last_role``, ``last_contains`` (substring of the last
message's text), ``contains`` (substring of any message's text), ``tool_offered`` (a function name in
``tools``), ``no_tools`` (bool), ``model``, ``stream`` (bool). ``times`` limits how often a rule fires.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

try:
    from tests.peers.asgi import Receive, Send, lifespan, read_body
except ModuleNotFoundError:  # run as a script: this directory is on sys.path
    from asgi import Receive, Send, lifespan, read_body  # type: ignore[no-redef]

Reply = Mapping[str, Any] | Callable[["RecordedRequest"], Mapping[str, Any]]

# --- reply builders ------------------------------------------------------------------------------------


def text(content: str, **extra: Any) -> dict[str, Any]:
    """A final answer."""
    return {"content": content, **extra}


def tool_call(
    name: str, arguments: str | Mapping[str, Any] | None = None, *, id: str | None = None, **extra: Any
) -> dict[str, Any]:
    """One tool call (``arguments`` as a dict or as raw JSON text)."""
    call: dict[str, Any] = {"name": name, "arguments": {} if arguments is None else arguments}
    if id is not None:
        call["id"] = id
    return {"tool_calls": [call], **extra}


def tool_calls(*calls: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    """Several tool calls in one reply: ``tool_calls(("a__x", {...}), ("b__y", "{}"))``."""
    return {"tool_calls": [{"name": name, "arguments": args} for name, args in calls], **extra}


def status(
    code: int,
    *,
    retry_after: float | str | None = None,
    message: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An HTTP error reply (429 with ``retry_after``, 500, 401 ...)."""
    all_headers = dict(headers or {})
    if retry_after is not None:
        all_headers["Retry-After"] = str(retry_after)
    reply: dict[str, Any] = {"status": code, "headers": all_headers, **extra}
    if message is not None:
        reply["message"] = message
    return reply


def malformed(body: str = "this is not json", content_type: str = "application/json") -> dict[str, Any]:
    return {"raw": body, "content_type": content_type}


# --- requests ------------------------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else json.dumps(content)


@attrs.frozen
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages = self.body.get("messages") if isinstance(self.body, Mapping) else None
        return list(messages) if isinstance(messages, list) else []

    @property
    def tool_names(self) -> list[str]:
        tools = self.body.get("tools") if isinstance(self.body, Mapping) else None
        return [t["function"]["name"] for t in tools or [] if isinstance(t, Mapping) and "function" in t]

    @property
    def last_message(self) -> dict[str, Any]:
        return self.messages[-1] if self.messages else {}

    @property
    def stream(self) -> bool:
        return isinstance(self.body, Mapping) and bool(self.body.get("stream"))

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "headers": self.headers, "body": self.body}


def matches(match: Mapping[str, Any], request: RecordedRequest) -> bool:
    last = request.last_message
    checks = {
        "last_role": lambda v: last.get("role") == v,
        "last_contains": lambda v: v in _text_of(last.get("content")),
        "contains": lambda v: any(v in _text_of(m.get("content")) for m in request.messages),
        "tool_offered": lambda v: v in request.tool_names,
        "no_tools": lambda v: (not request.tool_names) == bool(v),
        "model": lambda v: isinstance(request.body, Mapping) and request.body.get("model") == v,
        "stream": lambda v: request.stream == bool(v),
    }
    for key, value in match.items():
        if key not in checks:
            raise ValueError(f"unknown match key {key!r}")
        if not checks[key](value):
            return False
    return True


@attrs.define
class Rule:
    match: Mapping[str, Any]
    reply: Reply
    times: int | None = None


@attrs.define(eq=False)
class Script:
    """The reply queue, the rules and the default; thread-free, used from one trio run."""

    replies: deque[Reply] = attrs.field(factory=deque)
    rules: list[Rule] = attrs.field(factory=list)
    default: Reply | None = None

    @classmethod
    def from_json(cls, data: Any) -> Script:
        if isinstance(data, list):
            return cls(deque(data))
        rules = [Rule(r.get("match", {}), r["reply"], r.get("times")) for r in data.get("rules", [])]
        return cls(deque(data.get("replies", [])), rules, data.get("default"))

    def choose(self, request: RecordedRequest) -> Mapping[str, Any]:
        reply: Reply | None = None
        for rule in self.rules:
            if (rule.times is None or rule.times > 0) and matches(rule.match, request):
                if rule.times is not None:
                    rule.times -= 1
                reply = rule.reply
                break
        if reply is None and self.replies:
            reply = self.replies.popleft()
        if reply is None:
            reply = self.default
        if reply is None:
            return {"status": 500, "message": "scripted gateway: script exhausted"}
        return reply(request) if callable(reply) else reply


# --- rendering -----------------------------------------------------------------------------------------


def _calls(reply: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for index, call in enumerate(reply.get("tool_calls") or []):
        arguments = call.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(
            {
                "id": call.get("id", f"call_{index + 1}"),
                "type": "function",
                "function": {"name": call["name"], "arguments": arguments},
            }
        )
    return calls


def _usage(reply: Mapping[str, Any]) -> dict[str, Any] | None:
    usage = reply.get("usage", {"prompt_tokens": 10, "completion_tokens": 5})
    if usage is None:
        return None
    usage = dict(usage)
    usage.setdefault("total_tokens", usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))
    return usage


def completion_body(reply: Mapping[str, Any], model: str) -> dict[str, Any]:
    calls = _calls(reply)
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
    if calls:
        message["tool_calls"] = calls
    body: dict[str, Any] = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reply.get("finish_reason", "tool_calls" if calls else "stop"),
            }
        ],
    }
    usage = _usage(reply)
    if usage is not None:
        body["usage"] = usage
    return body


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def stream_events(reply: Mapping[str, Any], model: str) -> list[bytes]:
    """The SSE events of a streamed reply, ending with the usage chunk and ``[DONE]``."""
    size = max(1, int(reply.get("chunk", 7)))
    calls = _calls(reply)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(data)}\n\n".encode()

    events = [chunk({"role": "assistant", "content": ""})]
    if reply.get("content"):
        events += [chunk({"content": piece}) for piece in _pieces(reply["content"], size)]
    for index, call in enumerate(calls):
        function = call["function"]
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": function["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        events += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in _pieces(function["arguments"], size)
        ]
    events.append(chunk({}, reply.get("finish_reason", "tool_calls" if calls else "stop")))
    usage = _usage(reply)
    if usage is not None:
        data = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [],
            "usage": usage,
        }
        events.append(f"data: {json.dumps(data)}\n\n".encode())
    events.append(b"data: [DONE]\n\n")
    return events


# --- the ASGI app --------------------------------------------------------------------------------------


@attrs.define(eq=False)
class GatewayApp:
    script: Script
    requests: list[RecordedRequest] = attrs.field(factory=list)
    on_request: Callable[[RecordedRequest], None] | None = None
    #: Called when a ``stall`` reply has sent its events and holds the stream open.
    on_stall: Callable[[RecordedRequest], None] | None = None
    #: ``GET …/models`` lists these (None: that route is a 404, as on a gateway without it).
    models: Sequence[str] | None = None
    #: When set, every request without ``Authorization: Bearer <token>`` gets a 401.
    token: str | None = None
    _arrived: trio.Event = attrs.field(factory=trio.Event)

    async def wait_for(self, count: int) -> None:
        """Until at least ``count`` requests have arrived (bound it with ``trio.fail_after``)."""
        while len(self.requests) < count:
            await self._arrived.wait()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        request = RecordedRequest(scope["method"], scope["path"], headers, body)
        self.requests.append(request)
        self._arrived.set()
        self._arrived = trio.Event()
        if self.on_request is not None:
            self.on_request(request)
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            await _respond(send, 401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
            return
        if scope["method"] == "GET" and scope["path"].endswith("/models") and self.models is not None:
            await _respond(send, 200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})
            return
        if scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
            await _respond(
                send, 404, {"error": {"message": f"no route {scope['path']}", "type": "not_found"}}
            )
            return
        reply = self.script.choose(request)
        if reply.get("echo_last"):
            reply = {**reply, "content": _text_of(request.last_message.get("content"))}
        if reply.get("delay"):
            # real time: the scripted model's think time, as the script sets it (virtual under autojump_clock)
            await trio.sleep(float(reply["delay"]))
        if reply.get("wait") is not None:
            await reply["wait"].wait()
        await self._render(send, reply, request)

    async def _render(self, send: Send, reply: Mapping[str, Any], request: RecordedRequest) -> None:
        headers = [(k.encode(), str(v).encode()) for k, v in (reply.get("headers") or {}).items()]
        code = int(reply.get("status", 200))
        if "raw" in reply:
            content_type = reply.get("content_type", "application/json")
            await _send_body(send, code, reply["raw"].encode(), content_type, headers)
            return
        if "json" in reply:
            await _respond(send, code, reply["json"], headers)
            return
        if code >= 300:
            message = reply.get("message", f"scripted HTTP {code}")
            await _respond(
                send, code, {"error": {"message": message, "type": "scripted", "code": code}}, headers
            )
            return
        model = request.body.get("model", "default") if isinstance(request.body, Mapping) else "default"
        streaming = reply.get("stream")
        if streaming is None:
            streaming = request.stream
        if not streaming:
            await _respond(send, code, completion_body(reply, model), headers)
            return
        headers.append((b"content-type", b"text/event-stream"))
        headers.append((b"cache-control", b"no-cache"))
        await send({"type": "http.response.start", "status": code, "headers": headers})
        events = stream_events(reply, model)
        if reply.get("usage_first") and _usage(reply) is not None:
            events.insert(1, events.pop(-2))  # the usage chunk comes just before [DONE]
        if reply.get("stall") is not None:
            for event in events[: int(reply["stall"])]:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            if self.on_stall is not None:
                self.on_stall(request)
            await trio.sleep_forever()
        if reply.get("cut") == "event":
            events = events[: max(1, len(events) // 2)]
        elif reply.get("cut"):
            events = [*events[: max(1, len(events) // 2)], b'data: {"id": "chatcmpl-scr']
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            if reply.get("chunk_delay"):
                await trio.sleep(float(reply["chunk_delay"]))  # real time: the script's pace between stream chunks
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _send_body(
    send: Send, code: int, body: bytes, content_type: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    all_headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *(headers or []),
    ]
    await send({"type": "http.response.start", "status": code, "headers": all_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _respond(
    send: Send, code: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _send_body(send, code, json.dumps(body).encode(), "application/json", headers)


# --- running it ----------------------------------------------------------------------------------------


@attrs.define(eq=False)
class ScriptedGateway:
    app: GatewayApp
    port: int
    scheme: str = "http"

    @property
    def origin(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The base URL to pass as ``--intelligence`` (``/chat/completions`` is appended by the client)."""
        return self.origin + "/v1"

    @property
    def completions_url(self) -> str:
        return self.url + "/chat/completions"

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.app.requests

    @property
    def script(self) -> Script:
        return self.app.script

    async def wait_for(self, count: int) -> None:
        """Until at least ``count`` requests have arrived (bound it with ``trio.fail_after``)."""
        await self.app.wait_for(count)

    def push(self, *replies: Reply) -> None:
        self.app.script.replies.extend(replies)

    def add_rule(self, match: Mapping[str, Any], reply: Reply, times: int | None = None) -> None:
        self.app.script.rules.append(Rule(match, reply, times))


def _hypercorn_config(port: int, certfile: str | None, keyfile: str | None) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [f"127.0.0.1:{port}"]
    config.loglevel = "WARNING"
    config.accesslog = None
    if certfile:
        config.certfile = certfile
        config.keyfile = keyfile
    return config


@asynccontextmanager
async def scripted_gateway(
    replies: Iterable[Reply] = (),
    *,
    rules: Sequence[Rule | tuple[Mapping[str, Any], Reply]] = (),
    default: Reply | None = None,
    port: int = 0,
    certfile: str | None = None,
    keyfile: str | None = None,
    models: Sequence[str] | None = None,
    token: str | None = None,
) -> AsyncIterator[ScriptedGateway]:
    """Serve a script on 127.0.0.1 (https when a cert is given) for the duration of the block."""
    script = Script(deque(replies), [r if isinstance(r, Rule) else Rule(*r) for r in rules], default)
    app = GatewayApp(script, models=models, token=token)
    config = _hypercorn_config(port, certfile, keyfile)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, app, config))  # type: ignore[arg-type]
        bound = int(binds[0].rsplit(":", 1)[1])
        yield ScriptedGateway(app, bound, "https" if certfile else "http")
        nursery.cancel_scope.cancel()


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (connections are refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gateway_argv(script: str | Path, record: str | Path | None = None) -> list[str]:
    """The command line that runs this gateway as a separate process (for ``launch.peer_server``)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--script", str(script)]
    if record is not None:
        argv += ["--record", str(record)]
    return argv


def read_record(record: str | Path) -> list[RecordedRequest]:
    """The requests a gateway process recorded, in arrival order."""
    path = Path(record)
    if not path.exists():
        return []
    return [RecordedRequest(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


async def _main(args: argparse.Namespace) -> None:
    script = Script.from_json(json.loads(Path(args.script).read_text()))
    record = Path(args.record).open("a", encoding="utf-8") if args.record else None

    def write(request: RecordedRequest) -> None:
        if record is not None:
            record.write(json.dumps(request.to_json()) + "\n")
            record.flush()

    app = GatewayApp(script, on_request=write)
    config = _hypercorn_config(args.port, args.certfile, args.keyfile)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, app, config))  # type: ignore[arg-type]
        bound = int(binds[0].rsplit(":", 1)[1])
        scheme = "https" if args.certfile else "http"
        print(f"LISTENING {scheme}://127.0.0.1:{bound}/v1", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Scripted OpenAI-compatible gateway (test peer)")
    parser.add_argument(
        "--script", required=True, help="JSON file: a list of replies or {replies, rules, default}"
    )
    parser.add_argument("--record", help="append every request as a JSON line to this file")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--certfile")
    parser.add_argument("--keyfile")
    args = parser.parse_args(argv)
    try:
        trio.run(_main, args)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
