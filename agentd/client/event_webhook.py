"""One MCP event subscription delivered by webhook: ``events/subscribe``, refreshed before its TTL lapses,
``events/unsubscribe`` when it ends.

Why it exists: an event type a server offers by webhook (agentd.mcp.webhooks) is pushed to agentd as signed
POSTs; agentd must register where (a route of its own HTTPS listener, agentd.transport.webhook_app) and with
which secret (a fresh one per subscription, generated here, sent only in ``events/subscribe``, never logged),
then keep the subscription alive. :class:`EventWebhook` is that loop: subscribe from the cursor (the answer's
watermark and ``truncated`` go to ``on_batch`` like a poll answer, so the cursor moves on quiet stretches), sleep
half-way to the granted ``refreshBefore``, subscribe again with the newest cursor; a ``terminated`` envelope
subscribes again at once. Deliveries reach ``on_batch`` through the receiver, each moving :attr:`cursor`. A
failing subscribe (the server down, a refused callback) is logged once per streak (``events.poll_failed``,
``delivery: "webhook"``) and retried with the poller's doubling backoff. When the loop is cancelled (drain,
another cluster member) it unsubscribes, shielded and bounded by the call timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from agentd import defaults
from agentd.client.events import OnBatch, Request
from agentd.errors import McpError, McpProtocolError
from agentd.mcp import events, webhooks
from agentd.mcp.client_session import ResultTypeError, SessionError
from agentd.telemetry.events import EventLog, null_log
from agentd.transport.webhook_app import Hook, WebhookReceiver


@attrs.define(eq=False)
class EventWebhook:
    """One subscription's webhook: :meth:`run` until cancelled."""

    request: Request
    receiver: WebhookReceiver
    server: str
    name: str
    arguments: Mapping[str, Any]
    on_batch: OnBatch
    cursor: str | None = None
    timeout: float = defaults.CALL_TIMEOUT
    log: EventLog = attrs.field(factory=null_log)
    ttl: float = defaults.EVENT_WEBHOOK_TTL
    refresh_floor: float = defaults.EVENT_WEBHOOK_REFRESH_MIN
    retry: float = defaults.EVENT_POLL_RETRY
    cap: float = defaults.EVENT_POLL_MAX
    wall_clock: Callable[[], float] = time.time
    #: Subscribes (and refreshes) answered so far, and deliveries taken (``agent://status``, tests).
    polls: int = 0
    subscription: str | None = None
    hook: Hook | None = None

    async def run(self) -> None:
        hook = self.hook = self.receiver.register(self._delivered)
        try:
            await self._keep(hook)
        finally:
            self.receiver.unregister(hook)
            with trio.move_on_after(self.timeout, shield=True):
                await self._unsubscribe(hook)

    async def _keep(self, hook: Hook) -> None:
        failures = 0
        while True:
            try:
                granted = await self.subscribe_once(hook)
            except (McpError, SessionError, trio.TooSlowError) as exc:
                failures += 1
                delay = min(self.retry * 2 ** min(failures - 1, 16), self.cap)
                if failures == 1:
                    error = str(exc) if isinstance(exc, McpError) else f"no answer within {self.timeout:g} s"
                    self.log.warn("events.poll_failed", server=self.server, event_type=self.name, error=error,
                                  retry_s=delay, delivery="webhook")
                await trio.sleep(delay)
                continue
            if failures:
                self.log.info("events.poll_recovered", server=self.server, event_type=self.name, failures=failures,
                              delivery="webhook")
                failures = 0
            delay = webhooks.refresh_delay(granted.refresh_before, now=self.wall_clock(), ttl=self.ttl,
                                           floor=self.refresh_floor)
            self.log.debug("events.subscribed", server=self.server, event_type=self.name,
                           subscription=granted.id, refresh_s=round(delay, 3))
            with trio.move_on_after(delay):
                await hook.terminated.wait()
            if hook.terminated.is_set():
                self.log.warn("events.poll_failed", server=self.server, event_type=self.name, delivery="webhook",
                              error=f"the server ended the subscription: {hook.reason}", ended=True)
                hook.terminated = trio.Event()

    async def subscribe_once(self, hook: Hook) -> webhooks.Subscribed:
        """One ``events/subscribe`` from :attr:`cursor` (the first, or a refresh): its watermark goes to
        ``on_batch``. A malformed answer is :class:`~agentd.errors.McpProtocolError`."""
        with trio.fail_after(self.timeout):
            result = await self.request("events/subscribe", webhooks.subscribe_params(
                self.name, self.arguments, hook.url, hook.secret, self.cursor, self.ttl))
        try:
            granted = webhooks.parse_subscribe(result)
        except ResultTypeError as exc:
            raise McpProtocolError(f"events/subscribe {self.name}: {exc}", server=self.server) from None
        self.polls += 1
        self.subscription = granted.id
        if granted.result.cursor is not None or granted.result.truncated:
            self.cursor = granted.result.cursor
            await self.on_batch(granted.result)
        return granted

    async def _delivered(self, result: events.PollResult) -> None:
        self.polls += 1
        if result.cursor is not None:
            self.cursor = result.cursor
        await self.on_batch(result)

    async def _unsubscribe(self, hook: Hook) -> None:
        if self.subscription is None:
            return
        try:
            await self.request("events/unsubscribe", webhooks.unsubscribe_params(self.name, self.arguments,
                                                                                 hook.url))
        except (McpError, SessionError) as exc:  # it lapses at its TTL anyway
            self.log.info("events.unsubscribe_failed", server=self.server, event_type=self.name, error=str(exc))
        else:
            self.log.info("events.unsubscribed", server=self.server, event_type=self.name,
                          subscription=self.subscription)
