"""An MCP test peer that speaks the events extension (``io.modelcontextprotocol/events``, SEP-3415) on the
2026-07-28 wire, written from the extension's text: the modern-only peer (modern_only_server.py) plus events.

``server/discover`` declares the extension. ``events/list`` lists ``ticket.created`` (poll; arguments ``queue``
filter on ``data.queue``) and ``alert.raised`` (webhook only: agentd refuses it unless it serves HTTPS). ``events/poll`` takes
``{name, arguments, cursor, maxEvents}``: a ``null`` cursor is "from now" (no events, the current cursor); a
cursor ``c<N>`` resumes after the N-th occurrence of the log; one behind the retention floor answers
``truncated: true`` from the floor. At most ``maxEvents`` come at once (``hasMore`` says there are more); every
answer carries ``nextPollMs``. Every ``events/*`` request must declare the extension in its per-request client
capabilities (else -32021); an unknown event name is -32011 (NotFound).

With ``--push`` ``ticket.created`` is offered by push too: ``events/stream`` answers an SSE stream for the
subscription, every frame with ``_meta["io.modelcontextprotocol/subscriptionId"]`` = the request's id:
``notifications/events/active`` (the starting cursor, ``truncated``), one ``notifications/events/event`` per
matching occurrence (with the cursor after it), and ``notifications/events/heartbeat`` (the cursor) every
``--heartbeat`` seconds of quiet. Closing the response ends the subscription.

With ``--webhook-ca PATH`` (the CA that signed agentd's serving certificate) ``alert.raised`` is delivered by
webhook, as SEP-3415 says: ``events/subscribe`` takes ``{name, arguments, delivery: {mode, url, secret}, cursor,
ttlMs}`` (an ``https`` URL and a ``whsec_`` secret, else -32602), POSTs a ``verification`` challenge to the URL
before the first subscribe of a URL answers (a wrong echo: -32015 ``challenge_failed``), and answers ``{id,
refreshBefore, cursor, truncated}`` (the TTL granted is the suggestion capped by ``--webhook-ttl``); the same
key again is a refresh. Every matching occurrence from the subscription's cursor is POSTed, signed per Standard
Webhooks (``webhook-id`` the eventId, ``webhook-timestamp``, ``webhook-signature: v1,…``,
``X-MCP-Subscription-Id``) with the cursor after it (a watermark: the next one is sent once this one was
acknowledged; a failed POST is tried five times in a row, then abandoned). ``events/unsubscribe`` ends it. Side doors:
``POST /_test/webhook/forge?kind=signature|stale|unsigned`` (a POST to the newest subscription's URL signed with
another secret, a timestamp ten minutes old, or no signature: its status), ``POST /_test/webhook/envelope?type=gap|terminated`` (a ``gap`` to the end of the log, or the newest subscription
ended with a ``terminated`` envelope: its status), ``POST /_test/webhook/replay`` (the
newest event POST again, byte for byte: its status), ``GET /_test/webhook/secrets`` (every secret it was given,
for a test to look for in agentd's logs); ``GET /_test/events`` lists ``subscribes``, ``unsubscribes`` and
``deliveries`` (no secrets).

Side doors: ``POST /_test/emit?name=&data=<json>&count=&lost=`` (``count`` occurrences, each data plus its
``seq``; ``lost`` ones before them that fall behind the floor at once), ``POST /_test/events/config?next_poll_ms=&floor=``
(the interval it suggests; drop every occurrence before ``floor``), ``POST /_test/events/garbage?kind=&count=``
(the next ``count`` polls answer garbage: ``cursor`` an integer cursor, ``events`` a non-array, ``data`` one
occurrence with 200 000 characters of data, in the next answer that has occurrences), ``GET /_test/events`` (the log, and every poll: its cursor,
arguments and trio time; every stream opened, and how many are open), ``POST /_test/events/drop_streams`` (end
every open stream abruptly).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import functools
import hashlib
import hmac
import json
import secrets
import ssl
import sys
import time
from typing import Any
from urllib.parse import parse_qs

import httpx
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from modern_only_server import (  # type: ignore[import-not-found]  # run as a script beside it
    CAPABILITIES,
    INVALID_PARAMS,
    META_CAPS,
    META_SUBSCRIPTION,
    MISSING_CAPABILITY,
    SERVER_INFO,
    VERSION,
    ModernPeer,
    RpcError,
    _json,
    _sse,
    _watch_disconnect,
)

EVENTS_EXT = "io.modelcontextprotocol/events"
NOT_FOUND = -32011
EVENT_TYPES = [
    {"name": "ticket.created", "description": "A ticket was filed.", "delivery": ["poll"],
     "inputSchema": {"type": "object", "properties": {"queue": {"type": "string"}}},
     "payloadSchema": {"type": "object", "properties": {"id": {"type": "string"}, "queue": {"type": "string"}}}},
    {"name": "alert.raised", "description": "An alert (webhook only).", "delivery": ["webhook"],
     "inputSchema": {"type": "object"}, "payloadSchema": {"type": "object"}},
]


class EventsPeer(ModernPeer):
    def __init__(self, *, next_poll_ms: int, push: bool = False, heartbeat: float = 30.0,
                 webhook_ca: str | None = None, webhook_ttl: float = 3600.0) -> None:
        super().__init__(filler_tools=0, page_size=0, keepalive=15.0)
        self.webhook_tls = ssl.create_default_context(cafile=webhook_ca) if webhook_ca else None
        self.webhook_ttl = webhook_ttl
        self.nursery: trio.Nursery | None = None
        self.hooks: dict[str, dict[str, Any]] = {}
        self.subscribes: list[dict[str, Any]] = []
        self.unsubscribes: list[dict[str, Any]] = []
        self.deliveries: list[dict[str, Any]] = []
        self.secrets: list[str] = []
        self.last_post: tuple[str, dict[str, str], bytes] | None = None
        self.types = [dict(t) for t in EVENT_TYPES]
        if push:
            self.types[0]["delivery"] = ["poll", "push"]
        self.heartbeat = heartbeat
        self.changed = trio.Event()
        self.open_streams: dict[int, trio.CancelScope] = {}
        self.streams_opened: list[dict[str, Any]] = []
        self.next_poll_ms = next_poll_ms
        self.floor = 0
        self.log: list[dict[str, Any]] = []
        self.polls: list[dict[str, Any]] = []
        self.garbage: tuple[str, int] | None = None

    def handlers(self) -> dict[str, Any]:
        return {**super().handlers(), "events/list": self.events_list, "events/poll": self.events_poll,
                "events/subscribe": self.events_subscribe, "events/unsubscribe": self.events_unsubscribe}

    def streams(self) -> dict[str, Any]:
        return {"events/stream": self.events_stream}

    async def discover(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"supportedVersions": [VERSION], "capabilities": {**CAPABILITIES, "extensions": {EVENTS_EXT: {}}},
                "serverInfo": SERVER_INFO, "instructions": "Events test peer.", "ttlMs": 0, "cacheScope": "private"}

    @staticmethod
    def _declared(params: dict[str, Any]) -> None:
        caps = params.get("_meta", {}).get(META_CAPS, {})
        extensions = caps.get("extensions") if isinstance(caps, dict) else None
        if not isinstance(extensions, dict) or EVENTS_EXT not in extensions:
            raise RpcError(200, MISSING_CAPABILITY, f"events/* requests must declare {EVENTS_EXT}",
                           {"requiredCapabilities": {"extensions": {EVENTS_EXT: {}}}})

    async def events_list(self, params: dict[str, Any]) -> dict[str, Any]:
        self._declared(params)
        return {"events": self.types}

    async def events_poll(self, params: dict[str, Any]) -> dict[str, Any]:
        self._declared(params)
        name, arguments, cursor = self._subscription(params, "poll")
        self.polls.append({"cursor": cursor, "arguments": arguments, "at": trio.current_time()})
        limit = params.get("maxEvents") if isinstance(params.get("maxEvents"), int) else 100
        garbage = self._take_garbage(with_events=cursor is not None and cursor != f"c{len(self.log)}")
        if garbage == "cursor":
            return {"events": [], "cursor": 12345, "nextPollMs": self.next_poll_ms}
        if garbage == "events":
            return {"events": "nope", "cursor": f"c{len(self.log)}", "nextPollMs": self.next_poll_ms}
        if cursor is None:
            return {"events": [], "cursor": f"c{len(self.log)}", "truncated": False, "hasMore": False,
                    "nextPollMs": self.next_poll_ms}
        if not isinstance(cursor, str) or not cursor.startswith("c") or not cursor[1:].isdigit():
            raise RpcError(200, INVALID_PARAMS, f"invalid cursor {cursor!r}")
        start = int(cursor[1:])
        truncated = start < self.floor
        start = max(start, self.floor)
        matching = [(i, e) for i, e in enumerate(self.log) if i >= start and self._matches(e, name, arguments)]
        batch = matching[:limit]
        end = batch[-1][0] + 1 if len(matching) > limit else len(self.log)
        events = [{k: e[k] for k in ("eventId", "name", "timestamp", "data")} for _, e in batch]
        if garbage == "data" and events:
            events[0] = {**events[0], "data": {"blob": "x" * 200_000}}
        return {"events": events, "cursor": f"c{end}", "truncated": truncated, "hasMore": len(matching) > limit,
                "nextPollMs": self.next_poll_ms}

    def _subscription(self, params: dict[str, Any], mode: str) -> tuple[str, dict[str, Any], Any]:
        name, arguments, cursor = params.get("name"), params.get("arguments") or {}, params.get("cursor")
        if name not in {t["name"] for t in self.types}:
            raise RpcError(200, NOT_FOUND, f"NotFound: no event type {name!r}", {"kind": "event"})
        if mode not in next(t for t in self.types if t["name"] == name)["delivery"]:
            raise RpcError(200, -32014, "Unsupported", {"feature": "deliveryMode", "value": mode})
        return str(name), arguments, cursor

    def _matches(self, entry: dict[str, Any], name: str, arguments: dict[str, Any]) -> bool:
        queue = arguments.get("queue")
        return bool(entry["name"] == name and (queue is None or entry["data"].get("queue") == queue))

    async def events_stream(self, rid: Any, params: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            self._declared(params)
            name, arguments, cursor = self._subscription(params, "push")
            if cursor is not None and (not isinstance(cursor, str) or not cursor[1:].isdigit()):
                raise RpcError(200, INVALID_PARAMS, f"invalid cursor {cursor!r}")
        except RpcError as err:
            await _json(send, 200, err.body(rid))
            return
        position = len(self.log) if cursor is None else int(cursor[1:])
        truncated = position < self.floor
        position = max(position, self.floor)
        self.streams_opened.append({"cursor": cursor, "arguments": arguments, "at": trio.current_time()})
        meta = {META_SUBSCRIPTION: rid}
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        await _sse(send, {"jsonrpc": "2.0", "method": "notifications/events/active",
                          "params": {"cursor": f"c{position}", "truncated": truncated, "_meta": meta}})
        key = len(self.streams_opened)
        with trio.CancelScope() as scope:
            self.open_streams[key] = scope
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
                    while True:
                        for index in range(position, len(self.log)):
                            entry = self.log[index]
                            position = index + 1
                            if not self._matches(entry, name, arguments):
                                continue
                            frame = {k: entry[k] for k in ("eventId", "name", "timestamp", "data")}
                            garbage = self._take_garbage()
                            frame["cursor"] = 12345 if garbage == "cursor" else f"c{position}"
                            if garbage == "data":
                                frame["data"] = {"blob": "x" * 200_000}
                            await _sse(send, {"jsonrpc": "2.0", "method": "notifications/events/event",
                                              "params": {**frame, "_meta": meta}})
                        changed = self.changed
                        with trio.move_on_after(self.heartbeat):
                            await changed.wait()
                            continue
                        await _sse(send, {"jsonrpc": "2.0", "method": "notifications/events/heartbeat",
                                          "params": {"cursor": f"c{position}", "_meta": meta}})
            finally:
                self.open_streams.pop(key, None)
        with trio.move_on_after(1, shield=True):
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:  # the client went away first
                pass

    # --- webhook delivery (--webhook-ca) ---

    @staticmethod
    def _sign(secret: str, msg_id: str, stamp: int, body: bytes) -> str:
        key = base64.b64decode(secret.removeprefix("whsec_"))
        mac = hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
        return "v1," + base64.b64encode(mac).decode()

    async def _raw_post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int | None, bytes]:
        assert self.webhook_tls is not None
        try:
            async with httpx.AsyncClient(verify=self.webhook_tls, timeout=10, follow_redirects=False) as client:
                reply = await client.post(url, content=body, headers=headers)
        except httpx.HTTPError:
            return None, b""
        return reply.status_code, reply.content

    async def _post(self, hook: dict[str, Any], msg_id: str, payload: dict[str, Any], *,
                    secret: str | None = None, stamp: int | None = None, record: bool = False
                    ) -> tuple[int | None, bytes]:
        body = json.dumps(payload).encode()
        stamp = int(time.time()) if stamp is None else stamp
        headers = {"content-type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(stamp),
                   "webhook-signature": self._sign(secret or hook["secret"], msg_id, stamp, body),
                   "x-mcp-subscription-id": hook["id"]}
        if record:  # a real delivery: what /_test/webhook/replay sends again
            self.last_post = (hook["url"], headers, body)
        return await self._raw_post(hook["url"], headers, body)

    async def events_subscribe(self, params: dict[str, Any]) -> dict[str, Any]:
        self._declared(params)
        name, arguments, cursor = self._subscription(params, "webhook")
        delivery = params.get("delivery") if isinstance(params.get("delivery"), dict) else {}
        url, secret = delivery.get("url"), delivery.get("secret")
        if not isinstance(url, str) or not url.startswith("https://"):
            raise RpcError(200, INVALID_PARAMS, "delivery.url must be an https URL")
        try:
            raw = base64.b64decode(str(secret).removeprefix("whsec_"), validate=True)
        except ValueError:
            raw = b""
        if not str(secret).startswith("whsec_") or not 24 <= len(raw) <= 64:
            raise RpcError(200, INVALID_PARAMS, "delivery.secret must be whsec_ and base64 of 24-64 bytes")
        if cursor is not None and (not isinstance(cursor, str) or not cursor[1:].isdigit()):
            raise RpcError(200, INVALID_PARAMS, f"invalid cursor {cursor!r}")
        sub_id = "sub_" + hashlib.sha256(json.dumps([url, name, arguments], sort_keys=True).encode()).hexdigest()[:16]
        hook = self.hooks.get(sub_id)
        refresh = hook is not None
        self.secrets.append(str(secret))
        truncated = False
        if hook is None:
            hook = {"id": sub_id, "url": url, "secret": secret, "name": name, "arguments": arguments}
            challenge = secrets.token_hex(16)
            status, body = await self._post(hook, f"msg_verification_{secrets.token_hex(6)}",
                                            {"type": "verification", "challenge": challenge})
            try:
                echoed = json.loads(body).get("challenge") if status == 200 else None
            except ValueError:
                echoed = None
            if echoed != challenge:
                raise RpcError(200, -32015, "CallbackEndpointError", {"reason": "challenge_failed"})
            position = len(self.log) if cursor is None else int(cursor[1:])
            truncated = position < self.floor
            hook["acked"] = max(position, self.floor)
            self.hooks[sub_id] = hook
            assert self.nursery is not None
            self.nursery.start_soon(self._deliver, hook)
        hook["secret"] = secret
        ttl = params.get("ttlMs")
        granted = min(ttl / 1000 if isinstance(ttl, int | float) else self.webhook_ttl, self.webhook_ttl)
        refresh_before = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=granted)
        self.subscribes.append({"id": sub_id, "cursor": cursor, "arguments": arguments, "refresh": refresh,
                                "url": url, "ttlMs": ttl, "at": trio.current_time()})
        return {"id": sub_id, "refreshBefore": refresh_before.isoformat().replace("+00:00", "Z"),
                "cursor": f"c{hook['acked']}", "truncated": truncated}

    async def events_unsubscribe(self, params: dict[str, Any]) -> dict[str, Any]:
        self._declared(params)
        url = (params.get("delivery") or {}).get("url")
        for sub_id, hook in list(self.hooks.items()):
            if hook["url"] == url and hook["name"] == params.get("name"):
                del self.hooks[sub_id]
                self.unsubscribes.append({"id": sub_id, "url": url})
                self.changed.set()
                self.changed = trio.Event()
                return {}
        raise RpcError(200, NOT_FOUND, "NotFound: no such subscription", {"kind": "subscription"})

    async def _deliver(self, hook: dict[str, Any]) -> None:
        """POST each matching occurrence after the subscription's watermark, one at a time, until unsubscribed."""
        while self.hooks.get(hook["id"]) is hook:
            for index in range(hook["acked"], len(self.log)):
                entry = self.log[index]
                if self._matches(entry, hook["name"], hook["arguments"]):
                    payload = {**{k: entry[k] for k in ("eventId", "name", "timestamp", "data")},
                               "cursor": f"c{index + 1}"}
                    for attempt in range(5):
                        status, _ = await self._post(hook, entry["eventId"], payload, record=True)
                        self.deliveries.append({"id": hook["id"], "webhook_id": entry["eventId"], "status": status,
                                                "attempt": attempt})
                        if status is not None and 200 <= status < 300:
                            break
                hook["acked"] = index + 1
            changed = self.changed
            if hook["acked"] >= len(self.log):
                await changed.wait()

    async def _forge(self, kind: str) -> int | None:
        hook = list(self.hooks.values())[-1]
        payload = {"eventId": f"evt-forged-{kind}", "name": hook["name"], "timestamp": "2026-12-07T00:00:00Z",
                   "data": {"title": f"forged ({kind})"}, "cursor": "c999"}
        if kind == "signature":
            other = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
            return (await self._post(hook, payload["eventId"], payload, secret=other))[0]
        if kind == "stale":
            return (await self._post(hook, payload["eventId"], payload, stamp=int(time.time()) - 600))[0]
        body = json.dumps(payload).encode()
        return (await self._raw_post(hook["url"], {"content-type": "application/json",
                                                   "webhook-id": payload["eventId"]}, body))[0]

    def _append(self, name: str, data: dict[str, Any]) -> str:
        index = len(self.log)
        self.log.append({"eventId": f"evt-{index}", "name": name, "timestamp": f"2026-12-07T00:00:{index % 60:02d}Z",
                         "data": {**data, "seq": index}})
        self.changed.set()
        self.changed = trio.Event()
        return f"evt-{index}"

    def _take_garbage(self, *, with_events: bool = True) -> str | None:
        """The garbage the next answer carries; ``data`` waits for an answer with events to spoil."""
        if self.garbage is None or (self.garbage[0] == "data" and not with_events):
            return None
        kind, count = self.garbage
        self.garbage = (kind, count - 1) if count > 1 else None
        return kind

    async def side_door(self, path: str, method: str, scope: dict[str, Any], send: Any) -> None:
        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        if path == "/_test/emit" and method == "POST":
            # ``lost`` occurrences first, dropped at once (the floor moves past them), then ``count`` kept ones:
            # all in one step, so no poll falls between them.
            data = json.loads(query.get("data", "{}"))
            name = query.get("name", "ticket.created")
            for _ in range(int(query.get("lost", "0"))):
                self._append(name, {**data, "lost": True})
            self.floor = len(self.log) if "lost" in query else self.floor
            ids = [self._append(name, data) for _ in range(int(query.get("count", "1")))]
            await _json(send, 200, {"eventIds": ids, "cursor": f"c{len(self.log)}"})
        elif path == "/_test/events/config" and method == "POST":
            if "next_poll_ms" in query:
                self.next_poll_ms = int(query["next_poll_ms"])
            if "floor" in query:
                self.floor = int(query["floor"])
            await _json(send, 200, {"next_poll_ms": self.next_poll_ms, "floor": self.floor})
        elif path == "/_test/events/garbage" and method == "POST":
            self.garbage = (query.get("kind", "cursor"), int(query.get("count", "1")))
            await _json(send, 200, {"garbage": self.garbage[0]})
        elif path == "/_test/events/drop_streams" and method == "POST":
            for scope in list(self.open_streams.values()):
                scope.cancel()
            await _json(send, 200, {"dropped": len(self.open_streams)})
        elif path == "/_test/webhook/forge" and method == "POST":
            await _json(send, 200, {"status": await self._forge(query.get("kind", "signature"))})
        elif path == "/_test/webhook/envelope" and method == "POST":
            hook = list(self.hooks.values())[-1]
            kind = query.get("type", "gap")
            if kind == "gap":  # events were skipped: the watermark jumps to the end of the log
                hook["acked"] = len(self.log)
                envelope: dict[str, Any] = {"type": "gap", "cursor": f"c{len(self.log)}"}
            else:  # the subscription ends server-side
                del self.hooks[hook["id"]]
                self.changed.set()
                self.changed = trio.Event()
                envelope = {"type": "terminated", "error": {"code": -32012, "message": "access revoked"}}
            status, _ = await self._post(hook, f"msg_{kind}_{secrets.token_hex(6)}", envelope)
            await _json(send, 200, {"status": status})
        elif path == "/_test/webhook/replay" and method == "POST":
            assert self.last_post is not None, "nothing was POSTed yet"
            url, headers, body = self.last_post
            await _json(send, 200, {"status": (await self._raw_post(url, headers, body))[0],
                                    "webhook_id": headers["webhook-id"]})
        elif path == "/_test/webhook/secrets":
            await _json(send, 200, {"secrets": self.secrets})
        elif path == "/_test/events":
            await _json(send, 200, {"log": self.log, "polls": self.polls, "floor": self.floor,
                                    "streams": self.streams_opened, "open_streams": len(self.open_streams),
                                    "subscribes": self.subscribes, "unsubscribes": self.unsubscribes,
                                    "deliveries": self.deliveries})
        else:
            await super().side_door(path, method, scope, send)


async def main(args: argparse.Namespace) -> None:
    app = EventsPeer(next_poll_ms=args.next_poll_ms, push=args.push, heartbeat=args.heartbeat,
                     webhook_ca=args.webhook_ca, webhook_ttl=args.webhook_ttl)
    config = Config()
    config.bind = [f"{args.host}:{args.port}"]
    config.loglevel = "WARNING"
    config.accesslog = None
    config.graceful_timeout = 1
    async with trio.open_nursery() as nursery:
        app.nursery = nursery
        binds = await nursery.start(functools.partial(serve, app, config, mode="asgi"))  # type: ignore[arg-type]
        url = binds[0] if binds else f"http://{args.host}:{args.port}"
        print(f"LISTENING {url}/mcp", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="MCP events (SEP-3415) test peer on the 2026-07-28 wire")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--next-poll-ms", type=int, default=1000, help="the nextPollMs every poll answer suggests")
    p.add_argument("--push", action="store_true", help="offer ticket.created by push (events/stream) too")
    p.add_argument("--heartbeat", type=float, default=30.0, help="seconds between heartbeats on a quiet stream")
    p.add_argument("--webhook-ca", help="deliver alert.raised by webhook, trusting this CA for the callback URL")
    p.add_argument("--webhook-ttl", type=float, default=3600.0, help="the longest TTL a subscribe is granted (s)")
    return p.parse_args(argv)


if __name__ == "__main__":
    try:
        trio.run(main, parse_args())
    except KeyboardInterrupt:
        sys.exit(0)
