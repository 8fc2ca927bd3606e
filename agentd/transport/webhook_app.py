"""``/_agentd/webhooks/events/<route>``: where MCP servers POST the events agentd subscribed to by webhook.

Why it exists: an event type a server offers only by webhook (``events/subscribe``, agentd.mcp.webhooks) is
delivered as signed POSTs to an ``https`` URL of the client's; a reactive agentd that serves HTTPS
(``--serve-mcp https://…``) receives them on its own listener. Each subscription registers a :class:`Hook` here
(:meth:`WebhookReceiver.register`): an unguessable route (the URL's last segment, so the verification challenge,
which arrives before the server has answered ``events/subscribe``, already finds it) and the subscription's own
secret, generated per subscription and known only to this process and that server.

The path is authenticated by the signature, not by the listener's bearer (the server has no bearer to send):
a POST whose ``webhook-signature`` does not verify with the hook's secret, or whose ``webhook-timestamp`` is more
than five minutes off, is 401 and logged (``webhook.refused``: the reason, never the secret or the signature).
The body is bounded (``EVENT_WEBHOOK_MAX_BODY``: 413) and read within ``EVENT_WEBHOOK_BODY_TIMEOUT``. A verified
POST whose ``webhook-id`` was seen already (the hook keeps the last ``EVENT_WEBHOOK_SEEN``) is answered 200 and
dropped. A verified occurrence or gap is handed to the hook's ``on_batch`` (the same path as a poll answer:
agentd.modes.events) before the 2xx, so the server retries what agentd never took; a ``verification`` is
answered with its challenge; ``terminated`` tells the hook (its subscriber subscribes again).
"""

from __future__ import annotations

import collections
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Final

import attrs
import trio

from agentd import defaults
from agentd.mcp import webhooks
from agentd.mcp.client_session import ResultTypeError
from agentd.mcp.events import PollResult
from agentd.mcp.server_session import HttpReply
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

#: Where the receiver is mounted (every route below it).
PATH: Final = "/_agentd/webhooks/events"

OnBatch = Callable[[PollResult], Awaitable[None]]


def _reply(status: int, text: str) -> HttpReply:
    return HttpReply(status, text.encode(), "text/plain")


@attrs.define(eq=False)
class Hook:
    """One webhook subscription's end of the receiver: its URL, its secret, what it hands deliveries to."""

    route: str
    url: str
    secret: str = attrs.field(repr=False)
    on_batch: OnBatch
    #: Set (and replaced) when the server says the subscription ended.
    terminated: trio.Event = attrs.field(factory=trio.Event)
    reason: str | None = None
    seen: collections.OrderedDict[str, None] = attrs.field(factory=collections.OrderedDict, repr=False)
    deliveries: int = 0

    def first_time(self, msg_id: str, bound: int) -> bool:
        if msg_id in self.seen:
            return False
        self.seen[msg_id] = None
        while len(self.seen) > bound:
            self.seen.popitem(last=False)
        return True


@attrs.define(eq=False)
class WebhookReceiver:
    """The ASGI app and its table of hooks. ``base_url`` is the listener's ``https://host:port`` once bound
    (None: agentd does not serve HTTPS, so it cannot be called back)."""

    log: EventLog = attrs.field(factory=null_log)
    base_url: str | None = None
    max_body: int = defaults.EVENT_WEBHOOK_MAX_BODY
    body_timeout: float = defaults.EVENT_WEBHOOK_BODY_TIMEOUT
    seen: int = defaults.EVENT_WEBHOOK_SEEN
    tolerance: float = webhooks.TOLERANCE
    #: Seconds since the epoch (tests pass one of their own).
    wall_clock: Callable[[], float] = time.time
    _hooks: dict[str, Hook] = attrs.field(factory=dict, init=False)

    def register(self, on_batch: OnBatch) -> Hook:
        """A new hook with a fresh route and secret; :meth:`unregister` it when the subscription ends."""
        if self.base_url is None:
            raise RuntimeError("the webhook receiver is not bound to an https listener")
        route, secret = secrets.token_urlsafe(18), webhooks.new_secret()
        # Never in a log line, even one quoting a server's error that echoes it.
        self.log.redactor.add(secret)
        self.log.redactor.add(secret.removeprefix(webhooks.SECRET_PREFIX))
        hook = Hook(route, f"{self.base_url}{PATH}/{route}", secret, on_batch)
        self._hooks[route] = hook
        return hook

    def unregister(self, hook: Hook) -> None:
        self._hooks.pop(hook.route, None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = request_headers(scope)
        hook = self._hooks.get(scope["path"].removeprefix(PATH + "/"))
        if hook is None or scope["method"] != "POST":
            await discard_body(headers, receive)
            await send_reply(send, _reply(404 if hook is None else 405, "not found" if hook is None else
                                          "POST only"))
            return
        try:
            body = await read_body(headers, receive, limit=self.max_body, timeout=self.body_timeout)
        except TooLarge:
            await discard_body(headers, receive)
            await send_reply(send, _reply(413, f"a webhook body is at most {self.max_body} bytes"))
            return
        except trio.TooSlowError:
            await send_reply(send, _reply(408, "the body did not arrive in time"))
            return
        refused = webhooks.verify(hook.secret, headers, body, now=self.wall_clock(), tolerance=self.tolerance)
        if refused is not None:
            self.log.warn("webhook.refused", route=hook.route[:6], reason=refused,
                          subscription=headers.get(webhooks.SUBSCRIPTION_HEADER, "")[:64],
                          webhook_id=headers.get(webhooks.ID_HEADER, "")[:64])
            await send_reply(send, _reply(401, "signature not verified"))
            return
        msg_id = headers[webhooks.ID_HEADER]
        if not hook.first_time(msg_id, self.seen):
            self.log.info("webhook.duplicate", route=hook.route[:6], webhook_id=msg_id[:64])
            await send_reply(send, _reply(200, "duplicate"))
            return
        try:
            said = webhooks.delivery(body)
        except ResultTypeError as exc:
            hook.seen.pop(msg_id, None)
            self.log.warn("webhook.malformed", route=hook.route[:6], webhook_id=msg_id[:64], error=str(exc))
            await send_reply(send, _reply(400, str(exc)))
            return
        if said.challenge is not None:
            await send_reply(send, HttpReply(200, json.dumps({"challenge": said.challenge}).encode()))
            return
        if said.terminated is not None:
            hook.reason = said.terminated
            hook.terminated.set()
            await send_reply(send, _reply(200, "ok"))
            return
        assert said.result is not None
        hook.deliveries += 1
        try:
            await hook.on_batch(said.result)
        except BaseException:
            hook.seen.pop(msg_id, None)  # not taken: the server's retry is not a duplicate
            raise
        await send_reply(send, _reply(200, "ok"))


__all__ = ["PATH", "Hook", "WebhookReceiver"]
